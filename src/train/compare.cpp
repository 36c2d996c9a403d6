#include "train/compare.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "parallel/dist.h"
#include "train/trainer.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

// Each mode fixes the precision and the optimizer, whatever the base config says.
std::vector<std::string> mode_overrides(const std::string& mode) {
  if (mode == "fp32") return {"precision.mode=fp32", "precision.stochastic_rounding=false", "optimizer.name=adamw"};
  if (mode == "mixed") return {"precision.mode=mixed", "precision.stochastic_rounding=false", "optimizer.name=adamw"};
  if (mode == "bf16") return {"precision.mode=bf16", "precision.stochastic_rounding=false", "optimizer.name=adamw"};
  if (mode == "bf16-sr") return {"precision.mode=bf16", "precision.stochastic_rounding=true", "optimizer.name=adamw"};
  // Pure bf16 with 8-bit moments: stochastic rounding keeps the small updates that 8-bit
  // moments and bf16 parameters would otherwise both lose.
  if (mode == "bf16-adam8bit")
    return {"precision.mode=bf16", "precision.stochastic_rounding=true", "optimizer.name=adamw8bit"};
  throw UsageError("unknown mode '" + mode + "'; use fp32, mixed, bf16, bf16-sr, bf16-adam8bit");
}

namespace {

struct ModeResult {
  std::string mode;
  double final_loss = 0, best_loss = 1e300, final_val = -1, tokens_per_s = 0;
  int64_t steps = 0, state_bytes = 0, peak_bytes = 0;
  std::string peak_source;
};

ModeResult summarise(const std::string& mode, const std::string& dir) {
  ModeResult r;
  r.mode = mode;
  std::vector<double> tps;
  std::ifstream in(dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("val_loss")) r.final_val = j["val_loss"];
    if (!j.contains("loss")) continue;
    r.steps = j["step"];
    r.final_loss = j["loss"];
    r.best_loss = std::min(r.best_loss, r.final_loss);
    if (r.steps > 1) tps.push_back(j["tokens_per_s"]);  // step 1 includes warm-up
    r.peak_bytes = std::max<int64_t>(r.peak_bytes, j["peak_mem_bytes"]);
    r.peak_source = j["peak_mem_source"];
  }
  if (!tps.empty()) {
    std::sort(tps.begin(), tps.end());
    r.tokens_per_s = tps[tps.size() / 2];
  }
  r.state_bytes = json::parse(read_text_file(dir + "/memory.json"))["total_state_bytes"];
  return r;
}

std::string quote_for_gnuplot(const std::string& s) {
  std::string out;
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return "'" + out + "'";
}

// loss.svg from each mode's metrics (gnuplot from Debian's gnuplot-nox); the .gp script is
// kept next to it so the plot can be re-made or restyled.
void plot(const std::string& out, const std::vector<ModeResult>& results) {
  std::ostringstream gp;
  gp << "set terminal svg size 900,560 dynamic background rgb 'white'\nset output "
     << quote_for_gnuplot(out + "/loss.svg")
     << "\nset title 'ptrain compare: training loss'\nset xlabel 'step'\nset ylabel 'loss (nats/token)'\nset grid\n"
     << "set key top right\nplot ";
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string data = out + "/" + results[i].mode + "/loss.dat";
    std::ofstream d(data);
    std::ifstream in(out + "/" + results[i].mode + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      json j = json::parse(line);
      if (j.contains("loss")) d << j["step"].get<int64_t>() << " " << j["loss"].get<double>() << "\n";
    }
    gp << (i ? ", " : "") << quote_for_gnuplot(data) << " using 1:2 with lines lw 2 title "
       << quote_for_gnuplot(results[i].mode);
  }
  gp << "\n";
  write_file_atomic(out + "/loss.gp", gp.str());
  const std::string cmd = "gnuplot " + out + "/loss.gp 2>&1";
  if (std::system(("command -v gnuplot >/dev/null 2>&1")) != 0) {
    log::warn("gnuplot not found: wrote ", out, "/loss.gp but no loss.svg (launch/setup.sh installs gnuplot-nox)");
    return;
  }
  if (std::system(cmd.c_str()) != 0) log::warn("gnuplot failed on ", out, "/loss.gp; no loss.svg");
}

// Runs `ptrain train --config F --set ...` as a child process (this same executable).
int run_child(const std::string& config, const std::vector<std::string>& sets) {
  std::vector<std::string> args{"/proc/self/exe", "train", "--config", config};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
    throw RuntimeError("compare: cannot start a training process: " + std::string(std::strerror(errno)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int compare(const CompareOptions& o) {
  if (o.modes.empty()) throw UsageError("--modes needs at least one of fp32, mixed, bf16, bf16-sr, bf16-adam8bit");
  std::vector<std::vector<std::string>> per_mode;
  for (const auto& m : o.modes) per_mode.push_back(mode_overrides(m));  // all modes checked before any run
  Config base = load_config(o.config_path, o.overrides);
  const std::string out = o.out_dir.empty() ? "runs/compare-" + base.run.name : o.out_dir;
  const bool rank0 = DistEnv::detect().rank == 0;

  std::vector<Config> configs;
  std::vector<std::vector<std::string>> mode_sets;
  for (size_t i = 0; i < o.modes.size(); ++i) {
    std::vector<std::string> sets = o.overrides;
    sets.insert(sets.end(), per_mode[i].begin(), per_mode[i].end());
    sets.push_back("run.output_dir=" + out + "/" + o.modes[i]);
    sets.push_back("checkpoint.save_final=false");
    sets.push_back("checkpoint.every_steps=0");
    sets.push_back("checkpoint.resume=");
    if (o.steps > 0) sets.push_back("training.steps=" + std::to_string(o.steps));
    configs.push_back(load_config(o.config_path, sets));  // every mode validated before any run
    mode_sets.push_back(sets);
  }
  const bool launched = DistEnv::detect().launcher != "none";
  for (size_t i = 0; i < configs.size(); ++i) {
    log::info("=== compare: mode ", i + 1, "/", configs.size(), " '", o.modes[i], "' (", configs[i].training.steps,
              " steps, same seed and data) ===");
    // Each mode in its own process, so its peak memory is its own (a process's peak RSS only
    // grows). Under a launcher the ranks run the modes in turn in-process instead.
    const int rc = launched ? train(configs[i]) : run_child(o.config_path, mode_sets[i]);
    if (rc != 0) return rc;
  }
  if (!rank0) return 0;

  std::vector<ModeResult> results;
  for (const auto& m : o.modes) results.push_back(summarise(m, out + "/" + m));
  const ModeResult* ref = nullptr;
  for (const auto& r : results)
    if (r.mode == "fp32") ref = &r;
  std::ostringstream md, csv;
  md << "# ptrain compare: " << o.config_path << "\n\nSame init (seed " << base.run.seed << "), same data order, "
     << results.front().steps << " steps. Δ is the final training loss relative to fp32.\n\n"
     << "| mode | final loss | best loss | final val loss | Δ vs fp32 | state bytes/rank | tokens/s (median) | peak "
        "memory |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  csv << "mode,steps,final_loss,best_loss,final_val_loss,delta_vs_fp32_pct,state_bytes_per_rank,tokens_per_s,peak_mem_"
         "bytes,peak_mem_source\n";
  for (const auto& r : results) {
    double pct = ref ? 100.0 * (r.final_loss - ref->final_loss) / ref->final_loss : 0.0;
    if (std::abs(pct) < 0.005) pct = 0.0;  // no "-0.00"
    const std::string delta = ref ? log::fixed(pct, 2) : "";
    const std::string val = r.final_val >= 0 ? log::fixed(r.final_val, 4) : "-";
    md << "| " << r.mode << " | " << log::fixed(r.final_loss, 4) << " | " << log::fixed(r.best_loss, 4) << " | " << val
       << " | " << (ref ? (delta[0] == '-' ? delta : "+" + delta) + " %" : "-") << " | " << log::bytes(r.state_bytes)
       << " | " << log::grouped(r.tokens_per_s) << " | " << log::bytes(r.peak_bytes)
       << (r.peak_source == "process_peak_rss" ? " (RSS)" : " (allocated)") << " |\n";
    csv << r.mode << "," << r.steps << "," << r.final_loss << "," << r.best_loss << "," << (r.final_val >= 0 ? val : "")
        << "," << delta << "," << r.state_bytes << "," << r.tokens_per_s << "," << r.peak_bytes << "," << r.peak_source
        << "\n";
  }
  write_file_atomic(out + "/summary.md", md.str());
  write_file_atomic(out + "/summary.csv", csv.str());
  plot(out, results);
  std::fputs(md.str().c_str(), stdout);
  log::info("compare outputs: ", out, "/summary.md, summary.csv, loss.svg, <mode>/metrics.jsonl");
  return 0;
}

}  // namespace ptrain
