#include "app/compare.h"

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
  const std::vector<std::string> nearest{"precision.stochastic_rounding=false", "precision.kahan_summation=false"};
  auto with = [&](std::vector<std::string> sets, const std::vector<std::string>& rounding) {
    sets.insert(sets.end(), rounding.begin(), rounding.end());
    return sets;
  };
  if (mode == "fp32") return with({"precision.mode=fp32", "optimizer.name=adamw"}, nearest);
  if (mode == "mixed") return with({"precision.mode=mixed", "optimizer.name=adamw"}, nearest);
  if (mode == "bf16") return with({"precision.mode=bf16", "optimizer.name=adamw"}, nearest);
  if (mode == "bf16-sr")
    return {"precision.mode=bf16", "precision.stochastic_rounding=true", "precision.kahan_summation=false",
            "optimizer.name=adamw"};
  if (mode == "bf16-kahan")
    return {"precision.mode=bf16", "precision.stochastic_rounding=false", "precision.kahan_summation=true",
            "optimizer.name=adamw"};
  // Pure bf16 with 8-bit moments: stochastic rounding keeps the small updates that 8-bit
  // moments and bf16 parameters would otherwise both lose.
  if (mode == "bf16-adam8bit")
    return {"precision.mode=bf16", "precision.stochastic_rounding=true", "precision.kahan_summation=false",
            "optimizer.name=adamw8bit"};
  throw UsageError("unknown mode '" + mode + "'; use fp32, mixed, bf16, bf16-sr, bf16-kahan, bf16-adam8bit");
}

SeedStats seed_stats(const std::vector<double>& values) {
  SeedStats s;
  if (values.empty()) return s;
  s.n = static_cast<int>(values.size());
  s.min = *std::min_element(values.begin(), values.end());
  s.max = *std::max_element(values.begin(), values.end());
  for (double v : values) s.mean += v / s.n;
  if (s.n > 1) {
    double ss = 0;
    for (double v : values) ss += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(ss / (s.n - 1));
  }
  return s;
}

bool beyond_seed_spread(const SeedStats& a, const SeedStats& b) {
  return a.n > 1 && b.n > 1 && (a.max < b.min || b.max < a.min);
}

namespace {

// The last fifth of the steps, where a decaying schedule's learning rate is smallest.
constexpr double kLateFraction = 0.2;

struct RunResult {  // one seed of one mode
  int64_t seed = 0, steps = 0, state_bytes = 0, num_params = 0, peak_bytes = 0;
  double final_loss = 0, best_loss = 1e300, final_val = -1, tokens_per_s = 0;
  int64_t computed = 0, lost = 0, computed_late = 0, lost_late = 0;
  std::string peak_source;
  std::vector<std::pair<int64_t, double>> losses;  // (step, training loss)
};

RunResult summarise(const std::string& dir, int64_t seed, int64_t total_steps) {
  RunResult r;
  r.seed = seed;
  std::vector<double> tps;
  std::ifstream in(dir + "/metrics.jsonl");
  const auto late_from = static_cast<int64_t>(std::ceil((1.0 - kLateFraction) * static_cast<double>(total_steps)));
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("val_loss")) r.final_val = j["val_loss"];
    if (j.contains("eval_loss")) r.final_val = j["eval_loss"];  // a preference objective's evaluation
    if (!j.contains("loss")) continue;
    r.steps = j["step"];
    r.final_loss = j["loss"];
    r.best_loss = std::min(r.best_loss, r.final_loss);
    r.losses.emplace_back(r.steps, r.final_loss);
    if (r.steps > 1) tps.push_back(j["tokens_per_s"]);  // step 1 includes warm-up
    r.peak_bytes = std::max<int64_t>(r.peak_bytes, j["peak_mem_bytes"]);
    r.peak_source = j["peak_mem_source"];
    if (j.contains("updates_computed")) {  // counted since the previous logged step
      const int64_t c = j["updates_computed"], l = j["updates_lost"];
      r.computed += c, r.lost += l;
      if (r.steps > late_from) r.computed_late += c, r.lost_late += l;
    }
  }
  if (!tps.empty()) {
    std::sort(tps.begin(), tps.end());
    r.tokens_per_s = tps[tps.size() / 2];
  }
  const json memory = json::parse(read_text_file(dir + "/memory.json"));
  r.state_bytes = memory["total_state_bytes"];
  r.num_params = memory["num_params"];
  return r;
}

// A run in `dir` trained exactly this config (its resolved config is the same text) to its last step.
bool finished(const std::string& dir, const Config& config) {
  std::error_code ec;
  if (!fs::exists(dir + "/metrics.jsonl", ec) || !fs::exists(dir + "/memory.json", ec) ||
      !fs::exists(dir + "/config.resolved.toml", ec))
    return false;
  if (read_text_file(dir + "/config.resolved.toml") != to_toml(config)) return false;
  std::ifstream in(dir + "/metrics.jsonl");
  bool last = false;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("loss") && j["step"] == config.training.steps) last = true;
  }
  return last;
}

struct ModeSummary {
  std::string mode;
  std::vector<RunResult> runs;
  SeedStats metric;  // final validation loss (or final training loss when a run has none)
  double lost_all = 0, lost_late = 0, tokens_per_s = 0, state_bytes_per_param = 0;
  int64_t peak_bytes = 0;
  std::string peak_source;
};

ModeSummary summarise_mode(const std::string& mode, std::vector<RunResult> runs, bool use_val) {
  ModeSummary m;
  m.mode = mode;
  std::vector<double> metric, tps;
  int64_t computed = 0, lost = 0, computed_late = 0, lost_late = 0;
  for (const auto& r : runs) {
    metric.push_back(use_val ? r.final_val : r.final_loss);
    tps.push_back(r.tokens_per_s);
    computed += r.computed, lost += r.lost, computed_late += r.computed_late, lost_late += r.lost_late;
    if (r.peak_bytes >= m.peak_bytes) m.peak_bytes = r.peak_bytes, m.peak_source = r.peak_source;
  }
  m.metric = seed_stats(metric);
  m.lost_all = computed ? static_cast<double>(lost) / static_cast<double>(computed) : 0.0;
  m.lost_late = computed_late ? static_cast<double>(lost_late) / static_cast<double>(computed_late) : 0.0;
  std::sort(tps.begin(), tps.end());
  m.tokens_per_s = tps[tps.size() / 2];
  m.state_bytes_per_param = static_cast<double>(runs.front().state_bytes) /
                            static_cast<double>(std::max<int64_t>(1, runs.front().num_params));
  m.runs = std::move(runs);
  return m;
}

std::string quote_for_gnuplot(const std::string& s) {
  std::string out;
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return "'" + out + "'";
}

// loss.svg: per mode the training loss's mean over the seeds as a line and, with more than one
// seed, the band from its lowest to its highest seed at each logged step (gnuplot from Debian's
// gnuplot-nox); the .gp script and each mode's loss.dat are kept next to it.
void plot(const std::string& out, const std::vector<ModeSummary>& modes) {
  std::ostringstream gp;
  const bool bands = modes.front().runs.size() > 1;
  gp << "set terminal svg size 900,560 dynamic background rgb 'white'\nset output "
     << quote_for_gnuplot(out + "/loss.svg") << "\nset title 'ptrain compare: training loss"
     << (bands ? " (mean over " + std::to_string(modes.front().runs.size()) + " seeds, band: lowest to highest seed)"
               : "")
     << "'\nset xlabel 'step'\nset ylabel 'loss (nats/token)'\nset grid\nset key top right\n"
     << "set style fill transparent solid 0.2 noborder\nplot ";
  for (size_t i = 0; i < modes.size(); ++i) {
    const std::string data = out + "/" + modes[i].mode + "/loss.dat";
    std::ofstream d(data);
    d << "# step mean min max (training loss over " << modes[i].runs.size() << " seeds)\n";
    for (size_t k = 0; k < modes[i].runs.front().losses.size(); ++k) {
      double sum = 0, lo = 1e300, hi = -1e300;
      size_t n = 0;
      for (const auto& r : modes[i].runs)
        if (k < r.losses.size())
          sum += r.losses[k].second, lo = std::min(lo, r.losses[k].second), hi = std::max(hi, r.losses[k].second), ++n;
      d << modes[i].runs.front().losses[k].first << " " << sum / static_cast<double>(n) << " " << lo << " " << hi
        << "\n";
    }
    const std::string colour = " lc " + std::to_string(i + 1);
    if (bands)
      gp << (i ? ", " : "") << quote_for_gnuplot(data) << " using 1:3:4 with filledcurves" << colour << " notitle";
    gp << (i || bands ? ", " : "") << quote_for_gnuplot(data) << " using 1:2 with lines lw 2" << colour << " title "
       << quote_for_gnuplot(modes[i].mode);
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

std::string pct(double fraction) { return log::fixed(100.0 * fraction, 2) + " %"; }

// One training run of the study: a mode at a seed, its output directory and resolved config.
struct Run {
  size_t mode;
  int64_t seed;
  std::string dir;
  Config config;
  std::vector<std::string> sets;
};

// Every run of the study, each config validated before any run starts.
std::vector<Run> plan_runs(const CompareOptions& o, const Config& base, const std::string& out) {
  std::vector<std::vector<std::string>> per_mode;
  for (const auto& m : o.modes) per_mode.push_back(mode_overrides(m));  // all modes checked before any run
  std::vector<Run> runs;
  for (size_t i = 0; i < o.modes.size(); ++i)
    for (int k = 0; k < o.seeds; ++k) {
      const int64_t seed = base.run.seed + k;
      const std::string dir = out + "/" + o.modes[i] + (o.seeds > 1 ? "/seed" + std::to_string(seed) : "");
      std::vector<std::string> sets = o.overrides;
      sets.insert(sets.end(), per_mode[i].begin(), per_mode[i].end());
      for (const std::string& s :
           {"run.output_dir=" + dir, "run.seed=" + std::to_string(seed),
            std::string("training.count_lost_updates=true"), std::string("checkpoint.save_final=false"),
            std::string("checkpoint.every_steps=0"), std::string("checkpoint.resume=")})
        sets.push_back(s);
      if (o.steps > 0) sets.push_back("training.steps=" + std::to_string(o.steps));
      Config config = load_config(o.config_path, sets);
      runs.push_back({i, seed, dir, std::move(config), std::move(sets)});
    }
  return runs;
}

// Trains every run not finished yet; the first failing run's exit code, else 0.
int execute_runs(const CompareOptions& o, const std::vector<Run>& runs) {
  const bool launched = DistEnv::detect().launcher != "none";
  for (size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    const std::string what = "run " + std::to_string(r + 1) + "/" + std::to_string(runs.size()) + ": mode '" +
                             o.modes[run.mode] + "', seed " + std::to_string(run.seed);
    if (finished(run.dir, run.config)) {  // an interrupted study goes on where it stopped
      log::info("=== compare: ", what, ": already finished in ", run.dir, " (same resolved config), not run again ===");
      continue;
    }
    log::info("=== compare: ", what, " (", run.config.training.steps, " steps) ===");
    // Each run in its own process, so its peak memory is its own (a process's peak RSS only
    // grows). Under a launcher the ranks run them in turn in-process instead.
    const int rc = launched ? train(run.config) : run_child(o.config_path, run.sets);
    if (rc != 0) return rc;
  }
  return 0;
}

// The summary's three tables: summary.md, summary.csv (a row per mode), runs.csv (a row per run).
struct Tables {
  std::ostringstream md, csv, runs_csv;
};

void write_headers(Tables& t, const CompareOptions& o, const Config& base, int64_t steps, const std::string& metric) {
  t.md << "# ptrain compare: " << o.config_path << "\n\n"
       << steps << " steps; " << o.seeds
       << (o.seeds > 1 ? " seeds (run.seed " + std::to_string(base.run.seed) + " to " +
                             std::to_string(base.run.seed + o.seeds - 1) + ")"
                       : " seed (" + std::to_string(base.run.seed) + ")")
       << ", each the same init, data order and rounding bits in every mode. " << metric
       << ": mean ± standard deviation (lowest – highest) over the seeds; Δ: the mean relative to fp32's; beyond "
          "spread: the seeds' ranges do not overlap (needs 2+ seeds). Lost updates: elements whose computed update was "
          "non-zero but whose stored value did not change, over all steps / the last 20 %.\n\n"
       << "| mode | " << metric
       << " | Δ vs fp32 | beyond spread | lost updates (all / last 20 %) | state B/param | "
          "tokens/s (median) | peak memory |\n"
       << "|---|---|---|---|---|---|---|---|\n";
  t.csv << "mode,steps,seeds,metric,mean,std,min,max,delta_vs_fp32_pct,beyond_spread,lost_updates_all,lost_updates_"
           "late,state_bytes_per_param,tokens_per_s,peak_mem_bytes,peak_mem_source\n";
  t.runs_csv << "mode,seed,steps,final_loss,best_loss,final_val_loss,updates_computed,updates_lost,updates_computed_"
                "late,updates_lost_late,state_bytes_per_rank,tokens_per_s,peak_mem_bytes\n";
}

// One mode's rows, against the fp32 reference `ref` (null when fp32 was not run).
void write_rows(Tables& t, const CompareOptions& o, const ModeSummary& m, const ModeSummary* ref, int64_t steps,
                bool use_val) {
  double delta = ref ? 100.0 * (m.metric.mean - ref->metric.mean) / ref->metric.mean : 0.0;
  if (std::abs(delta) < 0.005) delta = 0.0;  // no "-0.00"
  const std::string d = ref ? log::fixed(delta, 2) : "";
  const bool beyond = ref && &m != ref && beyond_seed_spread(m.metric, ref->metric);
  const std::string spread = !ref || &m == ref ? "-" : o.seeds < 2 ? "n/a (1 seed)" : beyond ? "**yes**" : "no";
  t.md << "| " << m.mode << " | " << log::fixed(m.metric.mean, 4)
       << (o.seeds > 1 ? " ± " + log::fixed(m.metric.std, 4) + " (" + log::fixed(m.metric.min, 4) + " – " +
                             log::fixed(m.metric.max, 4) + ")"
                       : "")
       << " | " << (ref ? (d[0] == '-' ? d : "+" + d) + " %" : "-") << " | " << spread << " | " << pct(m.lost_all)
       << " / " << pct(m.lost_late) << " | " << log::fixed(m.state_bytes_per_param, 2) << " | "
       << log::grouped(m.tokens_per_s) << " | " << log::bytes(m.peak_bytes)
       << (m.peak_source == "process_peak_rss" ? " (RSS)" : " (allocated)") << " |\n";
  t.csv << m.mode << "," << steps << "," << o.seeds << "," << (use_val ? "final_val_loss" : "final_loss") << ","
        << m.metric.mean << "," << m.metric.std << "," << m.metric.min << "," << m.metric.max << "," << d << ","
        << (beyond ? "yes" : "no") << "," << m.lost_all << "," << m.lost_late << "," << m.state_bytes_per_param << ","
        << m.tokens_per_s << "," << m.peak_bytes << "," << m.peak_source << "\n";
  for (const auto& r : m.runs)
    t.runs_csv << m.mode << "," << r.seed << "," << r.steps << "," << r.final_loss << "," << r.best_loss << ","
               << (r.final_val >= 0 ? std::to_string(r.final_val) : "") << "," << r.computed << "," << r.lost << ","
               << r.computed_late << "," << r.lost_late << "," << r.state_bytes << "," << r.tokens_per_s << ","
               << r.peak_bytes << "\n";
}

// Summarises the finished runs per mode and writes summary.md, summary.csv, runs.csv and the plot.
void write_summary(const CompareOptions& o, const Config& base, const std::string& out, const std::vector<Run>& runs) {
  std::vector<std::vector<RunResult>> results(o.modes.size());
  for (const auto& run : runs) results[run.mode].push_back(summarise(run.dir, run.seed, run.config.training.steps));
  bool use_val = true;  // every run evaluated: compare validation losses
  for (const auto& mode : results)
    for (const auto& r : mode) use_val = use_val && r.final_val >= 0;
  std::vector<ModeSummary> modes;
  for (size_t i = 0; i < o.modes.size(); ++i) modes.push_back(summarise_mode(o.modes[i], results[i], use_val));
  const ModeSummary* ref = nullptr;
  for (const auto& m : modes)
    if (m.mode == "fp32") ref = &m;
  const int64_t steps = modes.front().runs.front().steps;
  Tables t;
  write_headers(t, o, base, steps, use_val ? "final val loss" : "final loss");
  for (const auto& m : modes) write_rows(t, o, m, ref, steps, use_val);
  write_file_atomic(out + "/summary.md", t.md.str());
  write_file_atomic(out + "/summary.csv", t.csv.str());
  write_file_atomic(out + "/runs.csv", t.runs_csv.str());
  plot(out, modes);
  std::fputs(t.md.str().c_str(), stdout);
}

}  // namespace

int compare(const CompareOptions& o) {
  if (o.modes.empty())
    throw UsageError("--modes needs at least one of fp32, mixed, bf16, bf16-sr, bf16-kahan, bf16-adam8bit");
  if (o.seeds < 1) throw UsageError("--seeds must be at least 1");
  const Config base = load_config(o.config_path, o.overrides);
  const std::string out = o.out_dir.empty() ? "runs/compare-" + base.run.name : o.out_dir;
  const std::vector<Run> runs = plan_runs(o, base, out);
  if (const int rc = execute_runs(o, runs); rc != 0) return rc;
  if (DistEnv::detect().rank != 0) return 0;
  write_summary(o, base, out, runs);
  log::info("compare outputs: ", out, "/summary.md, summary.csv, runs.csv, loss.svg, <mode>",
            o.seeds > 1 ? "/seed<S>" : "", "/metrics.jsonl");
  return 0;
}

}  // namespace ptrain
