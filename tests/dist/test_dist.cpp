// Multi-rank properties through the real binary under `mpirun --oversubscribe` (CPU, MPI
// collectives): world-size invariance of the loss curve and parameters, per-rank memory and
// communication against their formulas, resharding checkpoints, failure handling and the
// sharded export.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "../unit/test_util.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "common/fs_util.h"
#include "model/layout.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"

using namespace ptrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string bin() { return test::kBinPath; }

struct Proc {
  int rc = -1;
  std::string output;
  double seconds = 0;
};

Proc sh(const std::string& cmd) {
  Proc r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Root containers need the two OMPI_ALLOW variables; vader's CMA needs ptrace, often barred.
const char* kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ";

std::string mpirun(int np, bool time_limit = true) {
  return std::string(kMpiEnv) + (time_limit ? "timeout 300 " : "") + "mpirun --oversubscribe --bind-to none -np " +
         std::to_string(np) + " ";
}

// Starts a long run of 3 ranks in the background, waits for its first logged step, sends
// `signal` to one rank (mpirun's children are the ranks), and waits for mpirun: the script
// prints "rc=<mpirun's exit code>" then the job's output. The whole script is time-limited,
// so a hang shows up as rc=124.
Proc fault(const test::TempDir& dir, const std::string& extra, const std::string& signal, int victim) {
  const std::string out = dir / "run", cfg = test::small_config(dir), log = dir / "log";
  return sh("timeout 200 bash -c '" + mpirun(3, false) + bin() + " --config " + cfg + " --set run.output_dir=" + out +
            " --set training.steps=100000 --set checkpoint.save_final=false " + extra + " > " + log +
            " 2>&1 & mp=$!; "
            "for i in $(seq 600); do [ -s " +
            out +
            "/metrics.jsonl ] && break; sleep 0.1; done; "
            "v=$(pgrep -P $mp | sort -n | sed -n " +
            std::to_string(victim + 1) + "p); kill -" + signal +
            " $v; "
            "wait $mp; echo rc=$?; kill -9 $v 2>/dev/null; cat " +
            log + "'");
}

// Trains the small test model at world size np with a global batch of 12 sequences.
Proc train(const test::TempDir& dir, int np, const std::string& out, const std::string& extra = "",
           const std::string& model = test::kSmallModel) {
  const std::string cfg = test::small_config(dir, "", 60000, model);
  return sh(mpirun(np) + bin() + " --config " + cfg + " --set run.output_dir=" + out +
            " --set data.micro_batch_size=" + std::to_string(12 / np) + " " + extra);
}

std::map<int64_t, json> metrics(const std::string& out) {
  std::map<int64_t, json> m;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("loss")) m[j["step"].get<int64_t>()] = j;
  }
  return m;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Unit flat vectors of a checkpoint, concatenated from its rank files.
std::map<std::string, at::Tensor> unit_flats(const std::string& ckpt) {
  json meta = json::parse(read_text_file(ckpt + "/meta.json"));
  const int ws = meta["world_size"];
  std::map<std::string, at::Tensor> out;
  for (const auto& u : meta["units"]) {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < ws; ++r)
      parts.push_back(
          SafetensorsFile(ckpt + "/model.rank" + std::to_string(r) + ".safetensors").tensor(u["name"]).clone());
    out[u["name"]] = at::cat(parts);
  }
  return out;
}

}  // namespace

TEST(Dist, LossCurveAndParametersIndependentOfWorldSize) {
  test::TempDir dir;
  std::map<int, std::map<int64_t, json>> curves;
  for (int np : {1, 2, 3, 4}) {
    const std::string out = dir / ("np" + std::to_string(np));
    Proc r = train(dir, np, out);
    ASSERT_EQ(r.rc, 0) << r.output;
    curves[np] = metrics(out);
    ASSERT_EQ(curves[np].size(), 20u);
  }
  for (int np : {2, 3, 4})
    for (int64_t step = 1; step <= 20; ++step) {
      EXPECT_LE(rel(curves[np][step]["loss"], curves[1][step]["loss"]), 1e-5) << "np=" << np << " step " << step;
      // The clip factor must not depend on the sharding either (it did with a float32 norm).
      EXPECT_LE(rel(curves[np][step]["grad_norm"], curves[1][step]["grad_norm"]), 1e-5)
          << "np=" << np << " step " << step;
    }
  auto base = unit_flats(dir / "np1/checkpoints/step_20");
  for (int np : {2, 3, 4}) {
    auto flats = unit_flats(dir / ("np" + std::to_string(np)) + "/checkpoints/step_20");
    for (const auto& [name, t] : base) {
      const double diff = (flats[name] - t).abs().max().item<double>(), scale = t.abs().max().item<double>();
      EXPECT_LE(diff, 1e-5 * scale) << "np=" << np << " unit " << name;
    }
  }
}

TEST(Dist, StateBytesPerRankMatchCheckPrediction) {
  test::TempDir dir;
  for (int np : {3, 4}) {  // 3 divides none of the unit sizes: padding is exercised
    const std::string out = dir / ("np" + std::to_string(np));
    Proc r = train(dir, np, out, "--set training.steps=1");
    ASSERT_EQ(r.rc, 0) << r.output;
    json measured = json::parse(read_text_file(out + "/memory.json"));
    Proc check =
        sh(bin() + " check --config " + test::small_config(dir) + " --world-size " + std::to_string(np) + " --json");
    ASSERT_EQ(check.rc, 0) << check.output;
    json predicted = json::parse(check.output.substr(check.output.find('{')));
    EXPECT_EQ(measured, predicted) << "np=" << np;
    // Each rank holds shard_numel(numel, np) elements of every unit: the total divided by np,
    // plus padding to a multiple of kUnitAlign.
    int64_t total = 0, padded = 0;
    const LlamaShape shape = test::small_shape();
    for (const auto& u : llama_units(shape, 0.02)) total += u.numel, padded += shard_numel(u.numel, np);
    EXPECT_EQ(measured["num_params"].get<int64_t>(), padded);
    EXPECT_GE(padded * np, total);
    EXPECT_LT(padded * np - total, static_cast<int64_t>(llama_units(shape, 0.02).size()) * np * kUnitAlign);
    EXPECT_EQ(measured["total_state_bytes"].get<int64_t>(), padded * 16);
  }
}

// The families' extra tensors (biases, q/k norms) are state the planner counts: memory.json at
// np 3 equals `ptrain check --json` for a full fine-tune of each family, with AdamW8bit for
// Qwen3, and for QLoRA over the biased Llama (its biases stay in the frozen base units).
TEST(Dist, FamilyStateBytesMatchCheckPrediction) {
  const std::string qlora =
      "--set lora.enabled=true --set lora.rank=4 --set quant.base=nf4 "
      "--set lora.targets='[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]'";
  for (const auto& [family, flags] : std::vector<std::pair<std::string, std::string>>{
           {"hf_llama_bias", ""},
           {"hf_qwen2", ""},
           {"hf_qwen3", "--set optimizer.name=adamw8bit --set precision.mode=bf16"},
           {"hf_mistral", ""},
           {"hf_llama_bias", qlora}}) {
    SCOPED_TRACE(family + " " + flags);
    test::TempDir dir;
    const std::string model = "hf_path = \"" + test::fixture(family) + "\"\n", out = dir / "np3";
    Proc r = train(dir, 3, out, "--set training.steps=1 " + flags, model);
    ASSERT_EQ(r.rc, 0) << r.output;
    Proc check = sh(bin() + " check --config " + test::small_config(dir, "", 60000, model) + " --world-size 3 --json " +
                    flags + " --set data.micro_batch_size=4");
    ASSERT_EQ(check.rc, 0) << check.output;
    EXPECT_EQ(json::parse(read_text_file(out + "/memory.json")),
              json::parse(check.output.substr(check.output.find('{'))));
  }
}

TEST(Dist, BytesCommunicatedPerStepMatchTheSchedule) {
  test::TempDir dir;
  const LlamaShape shape = test::small_shape();
  const int np = 2;
  int64_t all_units = 0, blocks = 0;
  for (const auto& u : llama_units(shape, 0.02)) {
    const int64_t padded = shard_numel(u.numel, np) * np * 4;  // fp32 bytes of the gathered buffer
    all_units += padded;
    if (u.kind == UnitKind::block) blocks += padded;
  }
  struct Case {
    const char* name;
    std::string flags;
    bool regather;  // blocks are gathered again in backward
  };
  for (const Case& k :
       {Case{"reshard", "--set parallel.reshard_after_forward=true", true},
        Case{"keep", "--set parallel.reshard_after_forward=false", false},
        Case{"recompute", "--set parallel.reshard_after_forward=false --set memory.activation_checkpointing=full",
             true}}) {
    const bool reshard = k.regather;
    const std::string out = dir / k.name;
    Proc r = train(dir, np, out, "--set training.steps=2 " + k.flags);
    ASSERT_EQ(r.rc, 0) << r.output;
    json step = metrics(out)[2];
    // forward all-gather of every unit, + backward re-gather of every block when resharded
    EXPECT_EQ(step["comm_all_gather_bytes"].get<int64_t>(), all_units + (reshard ? blocks : 0)) << k.name;
    // one reduce-scatter of every unit's gradient
    EXPECT_EQ(step["comm_reduce_scatter_bytes"].get<int64_t>(), all_units);
    // doubles: the step's trained-token count and its ids (num_tokens); its loss sum with SFT's
    // entropy sum and top-1 hits (train/step.cpp: one all-reduce of three); the grad norm; the stop flag
    EXPECT_EQ(step["comm_all_reduce_bytes"].get<int64_t>(), (2 + 3 + 1 + 1) * 8);
  }
}

TEST(Dist, CheckpointAtFourRanksResumesAtTwoAndOne) {
  test::TempDir dir;
  const std::string full = dir / "np4";
  Proc r = train(dir, 4, full, "--set checkpoint.every_steps=10 --set checkpoint.keep=5");
  ASSERT_EQ(r.rc, 0) << r.output;
  auto straight = metrics(full);
  for (int np : {2, 1}) {
    const std::string out = dir / ("resume_np" + std::to_string(np));
    Proc rr = train(dir, np, out, "--set checkpoint.resume=" + full + "/checkpoints/step_10");
    ASSERT_EQ(rr.rc, 0) << rr.output;
    auto resumed = metrics(out);
    for (int64_t step = 11; step <= 20; ++step) {
      ASSERT_TRUE(resumed.count(step)) << step;
      EXPECT_LE(rel(resumed[step]["loss"], straight[step]["loss"]), 1e-6) << "np=" << np << " step " << step;
    }
  }
}

// The job ended (no hang until the script's time limit), non-zero, quickly, saying `why`.
void expect_job_failed(const Proc& r, const std::string& why) {
  ASSERT_NE(r.output.find("rc="), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rc=0"), std::string::npos) << r.output;
  EXPECT_EQ(r.rc, 0) << "the script hit its time limit: the job hung\n" << r.output;
  EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 120) << r.output;
}

TEST(Dist, KilledRankStopsTheJobNamingIt) {
  test::TempDir dir;
  Proc r = fault(dir, "", "9", 1);
  expect_job_failed(r, "process rank 1");
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

TEST(Dist, HungRankMakesTheOthersAbortAfterTheTimeout) {
  test::TempDir dir;
  expect_job_failed(fault(dir, "--set parallel.timeout_s=5", "STOP", 2), "did not complete within parallel.timeout_s");
}

// One rank failing to write its part of a checkpoint (its file size limited, as a full disk
// would stop it: `ulimit -f`, SIGXFSZ ignored, so the write fails with EFBIG) at np 2 and 3:
// every rank fails the save, no step_N and no temporary directory is left, the error names the
// intact previous checkpoint, and the next run resumes from it.
TEST(Dist, ARankFailingItsCheckpointWriteLeavesNoHalfCheckpoint) {
  for (int np : {2, 3}) {
    test::TempDir dir;
    const std::string out = dir / "run", ck = out + "/checkpoints";
    const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 2\n");
    const std::string args =
        " --config " + cfg + " --set run.output_dir=" + out + " --set data.micro_batch_size=" + std::to_string(12 / np);
    ASSERT_EQ(sh(mpirun(np) + bin() + args + " --set training.steps=2").rc, 0);
    const int victim = np - 1;
    test::write_text(dir / "limited.sh", "if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(victim) +
                                             " ]; then ulimit -f 16; trap '' XFSZ; fi\nexec \"$@\"\n");
    Proc r = sh(mpirun(np) + "bash " + (dir / "limited.sh") + " " + bin() + args +
                " --set training.steps=4 --set checkpoint.resume=auto");
    EXPECT_NE(r.rc, 0) << r.output;
    EXPECT_NE(r.output.find("checkpoint step_4 was not written: 1 rank(s) failed to write their part"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("the previous checkpoint " + ck + "/step_2 is intact"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("checkpoint written: " + ck + "/step_4"), std::string::npos) << r.output;
    std::set<std::string> left;
    for (const auto& e : fs::directory_iterator(ck)) left.insert(e.path().filename());
    EXPECT_EQ(left, std::set<std::string>{"step_2"}) << "np=" << np;
    Proc again = sh(mpirun(np) + bin() + args + " --set training.steps=4 --set checkpoint.resume=auto");
    EXPECT_EQ(again.rc, 0) << again.output;
    EXPECT_NE(again.output.find("resumed from " + ck + "/step_2"), std::string::npos) << again.output;
    EXPECT_TRUE(fs::exists(ck + "/step_4/meta.json")) << "np=" << np;
  }
}

TEST(Dist, ShardedCheckpointExportsToHfExactly) {
  test::TempDir dir;
  const std::string out = dir / "np2";
  Proc r = train(dir, 2, out, "--set training.steps=3");
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::string ckpt = out + "/checkpoints/step_3";
  Proc e = sh(bin() + " export --checkpoint " + ckpt + " --out " + (dir / "hf"));
  ASSERT_EQ(e.rc, 0) << e.output;
  FsdpModel imported(test::plan(read_hf_config(dir / "hf")), PrecisionPolicy{}, at::kCPU, test::local_comm());
  load_weights(imported, HfCheckpoint(dir / "hf").by_name());
  auto flats = unit_flats(ckpt);
  for (const auto& u : imported.units(UnitRole::base))
    EXPECT_TRUE(at::equal(u.shard.detach(), flats[u.layout.name])) << u.layout.name;
}

TEST(Dist, SigtermStopsAfterTheStepWithACheckpoint) {
  test::TempDir dir;
  const std::string out = dir / "run", cfg = test::small_config(dir);
  Proc r = sh("timeout 120 bash -c '" + bin() + " --config " + cfg + " --set run.output_dir=" + out +
              " --set training.steps=100000 > " + (dir / "log") +
              " 2>&1 & p=$!; "
              "for i in $(seq 600); do [ -s " +
              out +
              "/metrics.jsonl ] && break; sleep 0.1; done; "
              "kill -TERM $p; wait $p; echo rc=$?; cat " +
              (dir / "log") + "'");
  EXPECT_NE(r.output.find("rc=130"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stop signal received"), std::string::npos) << r.output;
  // The checkpoint it wrote is complete and resumable.
  std::string latest;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) latest = e.path().string();
  ASSERT_TRUE(fs::exists(latest + "/meta.json")) << r.output;
  const int64_t step = json::parse(read_text_file(latest + "/meta.json"))["step"];
  Proc resume = sh(bin() + " --config " + cfg + " --set run.output_dir=" + out + " --set checkpoint.resume=auto" +
                   " --set training.steps=" + std::to_string(step + 2));
  EXPECT_EQ(resume.rc, 0) << resume.output;
  EXPECT_NE(resume.output.find("resumed from"), std::string::npos) << resume.output;
}

// Trains at np = 1 and 2 with `flags` and returns each run's output directory and losses.
using Runs = std::map<int, std::pair<std::string, std::map<int64_t, json>>>;

// Trains with `flags` at each world size in `nps` (the global batch is 12 at every one).
Runs runs_at(const test::TempDir& dir, const std::string& flags, const std::vector<int>& nps = {1, 2},
             const std::string& model = test::kSmallModel) {
  Runs out;
  for (int np : nps) {
    const std::string run = dir / ("np" + std::to_string(np));
    Proc r = train(dir, np, run, flags, model);
    EXPECT_EQ(r.rc, 0) << r.output;
    out[np] = {run, metrics(run)};
  }
  return out;
}

// Every one of `steps` losses at every world size within `tolerance` (relative) of np=1's.
void expect_same_curve(Runs& runs, int64_t steps, double tolerance) {
  ASSERT_EQ(runs[1].second.size(), static_cast<size_t>(steps));
  for (auto& [np, run] : runs)
    for (int64_t step = 1; step <= steps; ++step)
      EXPECT_LE(rel(run.second[step]["loss"], runs[1].second[step]["loss"]), tolerance)
          << "np=" << np << " step " << step;
}

// Every compare mode with bf16 compute gives the same losses at np=1 and np=2 within 1e-3
// (bf16 rounding of activations computed over different micro-batch shapes); fp32 is held to
// 1e-5 by LossCurveAndParametersIndependentOfWorldSize.
TEST(Dist, EveryBf16ModeMatchesAcrossWorldSizes) {
  for (const std::string mode :
       {"--set precision.mode=mixed", "--set precision.mode=bf16",
        "--set precision.mode=bf16 --set precision.stochastic_rounding=true",
        "--set precision.mode=bf16 --set precision.kahan_summation=true",
        "--set precision.mode=bf16 --set precision.stochastic_rounding=true --set optimizer.name=adamw8bit"}) {
    SCOPED_TRACE(mode);
    test::TempDir dir;
    auto runs = runs_at(dir, mode + " --set training.steps=10");
    expect_same_curve(runs, 10, 1e-3);
  }
}

TEST(Dist, OptimizerInBackwardMatchesAcrossWorldSizes) {
  test::TempDir dir;
  auto runs = runs_at(dir, "--set optimizer.in_backward=true --set training.max_grad_norm=0 --set training.steps=8");
  expect_same_curve(runs, 8, 1e-5);
  for (const auto& [np, run] : runs)
    EXPECT_EQ(json::parse(read_text_file(run.first + "/memory.json"))["grad_bytes"].get<int64_t>(), 0) << "np=" << np;
}

// AdamW8bit's blockwise state is the same at every world size: np=1 and np=2 give the same
// losses, memory.json matches `ptrain check`, and a checkpoint written at np=2 resumes at np=1
// and np=3 exactly (the 8-bit codes, absmax and float32 moments reshard).
TEST(Dist, AdamW8bitShardsPredictsAndReshards) {
  test::TempDir dir;
  const std::string flags = "--set optimizer.name=adamw8bit --set training.steps=10";
  auto runs = runs_at(dir, flags + " --set checkpoint.every_steps=5 --set checkpoint.keep=5");
  expect_same_curve(runs, 10, 1e-5);
  const std::string cfg = test::small_config(dir);
  for (const auto& [np, run] : runs) {
    Proc check = sh(bin() + " check --config " + cfg + " --set optimizer.name=adamw8bit --world-size " +
                    std::to_string(np) + " --json");
    ASSERT_EQ(check.rc, 0) << check.output;
    EXPECT_EQ(json::parse(read_text_file(run.first + "/memory.json")),
              json::parse(check.output.substr(check.output.find('{'))))
        << "np=" << np;
  }
  auto& straight = runs[2].second;
  for (int np : {1, 3}) {
    const std::string out = dir / ("resume_np" + std::to_string(np));
    Proc r = train(dir, np, out, flags + " --set checkpoint.resume=" + runs[2].first + "/checkpoints/step_5");
    ASSERT_EQ(r.rc, 0) << r.output;
    auto resumed = metrics(out);
    for (int64_t step = 6; step <= 10; ++step) {
      ASSERT_TRUE(resumed.count(step)) << step;
      EXPECT_LE(rel(resumed[step]["loss"], straight[step]["loss"]), 1e-6) << "np=" << np << " step " << step;
    }
  }
}

// Prefetching and asynchronous reduce-scatters change the schedule, not the numbers: the same
// losses bit for bit at np=3, mixed precision and with activation checkpointing, and the same
// bytes on the wire.
TEST(Dist, PrefetchOnAndOffAgreeExactly) {
  test::TempDir dir;
  for (const std::string extra : {"", "--set precision.mode=mixed --set memory.activation_checkpointing=full"}) {
    std::map<int64_t, json> curve[2];
    for (int prefetch : {0, 1}) {
      const std::string out = dir / ("p" + std::to_string(prefetch) + (extra.empty() ? "" : "_mixed"));
      Proc r = sh(mpirun(3) + bin() + " --config " + test::small_config(dir) + " --set run.output_dir=" + out +
                  " --set data.micro_batch_size=4 --set training.steps=6 --set parallel.prefetch=" +
                  (prefetch ? "true " : "false ") + extra);
      ASSERT_EQ(r.rc, 0) << r.output;
      curve[prefetch] = metrics(out);
    }
    ASSERT_EQ(curve[0].size(), 6u);
    for (const auto& [step, m] : curve[0]) {
      EXPECT_EQ(curve[1][step]["loss"], m["loss"]) << extra << " step " << step;
      EXPECT_EQ(curve[1][step]["comm_all_gather_bytes"], m["comm_all_gather_bytes"]) << extra << " step " << step;
      EXPECT_EQ(curve[1][step]["comm_reduce_scatter_bytes"], m["comm_reduce_scatter_bytes"])
          << extra << " step " << step;
    }
  }
}

// LoRA adapters are sharded units like any other: np=1 and np=2 train the same losses.
TEST(Dist, LoraMatchesAcrossWorldSizes) {
  test::TempDir dir;
  auto runs = runs_at(dir,
                      "--set lora.enabled=true --set lora.targets='[\"q\",\"v\",\"down\",\"output\"]' "
                      "--set lora.rank=4 --set optimizer.lr=1e-2 --set training.steps=8");
  expect_same_curve(runs, 8, 1e-5);
}

// A JSONL chat dataset, padded and packed: a step's loss is the mean over the trained tokens of
// all ranks, so np = 1, 2 and 3 (whose ranks hold different numbers of trained tokens) train
// the same losses. Sample prompts are decoded at each evaluation at every world size.
TEST(Dist, JsonlChatsTrainTheSameLossesAtAnyWorldSize) {
  for (const char* packing : {"false", "true"}) {
    SCOPED_TRACE(std::string("packing = ") + packing);
    test::TempDir dir;
    const std::string data = test::chat_jsonl(dir / "chats.jsonl", 150);
    auto runs =
        runs_at(dir,
                "--set data.format=jsonl --set data.path=" + data + " --set data.packing=" + packing +
                    " --set data.seq_len=96 --set training.steps=6 --set optimizer.lr=1e-2 "
                    "--set training.eval_every=3 --set training.sample_tokens=8 --set training.sample_chat=true "
                    "--set 'training.sample_prompts=[\"What is 2 + 2?\", \"Hi\"]'",
                {1, 2, 3}, "hf_path = \"" + test::fixture("hf_chat") + "\"\n");
    expect_same_curve(runs, 6, 1e-5);
    // Every rank decoded the sample prompts in step at each evaluation (rank 0 wrote them).
    for (const auto& [np, run] : runs) {
      std::ifstream in(run.first + "/metrics.jsonl");
      std::vector<int64_t> steps;
      for (std::string line; std::getline(in, line);)
        if (json j = json::parse(line); j.contains("sample")) steps.push_back(j["step"].get<int64_t>());
      EXPECT_EQ(steps, (std::vector<int64_t>{3, 3, 6, 6})) << "np=" << np;
    }
  }
}

// QLoRA with the NF4 base sharded like every unit: np = 1, 2 and 3 train the same losses; each
// rank holds 1/np of the 4-bit bytes (plus alignment padding), as `ptrain check` predicts; and
// the all-gathers carry each block's 4-bit bytes, not its matrices in the compute dtype.
TEST(Dist, QloraShardsTheNf4BaseAcrossRanks) {
  test::TempDir dir;
  const std::string flags =
      "--set lora.enabled=true --set lora.targets='[\"q\",\"v\",\"down\"]' --set lora.rank=4 "
      "--set quant.base=nf4 --set optimizer.lr=1e-2";
  auto runs = runs_at(dir, flags + " --set training.steps=8", {1, 2, 3});
  expect_same_curve(runs, 8, 1e-5);
  const LlamaShape shape = test::small_shape();
  const int64_t one_rank = json::parse(read_text_file(runs[1].first + "/memory.json"))["nf4_bytes"].get<int64_t>();
  for (const auto& [np, run] : runs) {
    const json measured = json::parse(read_text_file(run.first + "/memory.json"));
    Proc check = sh(bin() + " check --config " + test::small_config(dir) + " " + flags + " --world-size " +
                    std::to_string(np) + " --json");
    ASSERT_EQ(check.rc, 0) << check.output;
    EXPECT_EQ(measured, json::parse(check.output.substr(check.output.find('{')))) << "np=" << np;
    const int64_t held = measured["nf4_bytes"].get<int64_t>();
    EXPECT_GE(held * np, one_rank) << "np=" << np;
    EXPECT_LE(held * np, one_rank + shape.n_layers * np * kUnitAlign) << "np=" << np << ": " << held << " B per rank";
    std::cout << "np=" << np << ": NF4 base " << held << " B per rank (" << one_rank << " B at one rank)\n";
  }
  // One step's all-gathers at np = 2: every unit in forward, every block's units again in
  // backward (reshard_after_forward); in float32 on the CPU, the NF4 unit in bytes.
  const int np = 2;
  const auto full = llama_units(shape, 0.02), base = llama_units_without_block_matrices(shape, 0.02);
  const auto adapters = lora_units(shape, {"q", "v", "down"}, 4);
  auto wire = [&](int64_t numel, int64_t element_bytes) { return shard_numel(numel, np) * np * element_bytes; };
  int64_t expected = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    int64_t unit = wire(base[i].numel, 4) + wire(adapters[i].numel, 4);
    if (full[i].kind == UnitKind::block) unit = 2 * (unit + wire(nf4_unit_layout(full[i], true).numel, 1));
    expected += unit;
  }
  EXPECT_EQ(runs[2].second[2]["comm_all_gather_bytes"].get<int64_t>(), expected);
}

// llm.c-style step parity for every model family on shapes nothing is aligned to (odd
// vocabularies, GQA, head_dim != hidden / heads; biases and q/k norms where the family has them):
// every parameter gradient after one forward/backward, and the losses of ten clipped AdamW steps,
// against transformers + torch.optim (tests/fixtures/make_step_fixtures.py), at 1, 2 and 3 ranks,
// with and without activation checkpointing.
namespace {
// Runs tests/dist/step_parity.cpp against the reference in `expected_path` at 1, 2 and 3 ranks,
// with and without activation checkpointing: step 0's loss within 1e-6, every gradient the
// reference has (and only those) within 1e-5 of its tensor's largest, ten losses within 1e-5.
// Prints the worst differences.
void expect_step_parity(const std::string& label, const std::string& expected_path, const std::string& hf_dir,
                        const std::string& extra = "") {
  test::TempDir dir;
  SafetensorsFile expected(expected_path);
  double worst_grad = 0, worst_loss = 0;
  std::string worst_name;
  for (int np : {1, 2, 3})
    for (bool checkpointing : {false, true}) {
      const std::string what = label + " np=" + std::to_string(np) + (checkpointing ? " checkpointing" : "");
      const std::string out = dir / (checkpointing ? "np" + std::to_string(np) + "_checkpointing.safetensors"
                                                   : "np" + std::to_string(np) + ".safetensors");
      Proc r = sh(mpirun(np) + test::kStepParityPath + " " + expected_path + " " + hf_dir + " " + out +
                  (checkpointing ? " --checkpointing" : "") + extra);
      ASSERT_EQ(r.rc, 0) << what << "\n" << r.output;
      SafetensorsFile got(out);
      EXPECT_LE(rel(got.tensor("loss0").item<double>(), expected.tensor("loss0").item<double>()), 1e-6) << what;
      int64_t grads = 0, got_grads = 0;
      for (const auto& entry : got.entries()) got_grads += entry.name.rfind("grad.", 0) == 0;
      for (const auto& entry : expected.entries()) {
        const std::string& name = entry.name;
        if (name.rfind("grad.", 0) != 0) continue;
        ++grads;
        ASSERT_TRUE(got.contains(name)) << name << " " << what;
        at::Tensor ref = expected.tensor(name), g = got.tensor(name);
        ASSERT_EQ(g.sizes(), ref.sizes()) << name;
        // Largest elementwise difference relative to the tensor's largest gradient.
        const double d = (g - ref).abs().max().item<double>() / ref.abs().max().item<double>();
        if (d > worst_grad) worst_grad = d, worst_name = name;
        EXPECT_LE(d, 1e-5) << name << " " << what;
      }
      EXPECT_EQ(got_grads, grads) << "every trained parameter, and only those, has its gradient compared: " << what;
      at::Tensor losses = got.tensor("losses"), ref_losses = expected.tensor("losses");
      for (int64_t s = 0; s < ref_losses.size(0); ++s) {
        const double d = rel(losses[s].item<double>(), ref_losses[s].item<double>());
        worst_loss = std::max(worst_loss, d);
        EXPECT_LE(d, 1e-5) << "step " << s + 1 << " " << what;
      }
    }
  std::cout << label << " (np 1-3, with and without checkpointing): worst gradient difference " << worst_grad << " ("
            << worst_name << "), worst loss difference over 10 steps " << worst_loss << "\n";
}
}  // namespace

TEST(Dist, StepParityWithTransformersForEveryFamilyAtOneTwoAndThreeRanks) {
  for (const std::string model : {"hf_odd", "hf_llama_bias", "hf_qwen2", "hf_qwen3", "hf_mistral", "hf_pad"})
    expect_step_parity(model, test::fixture(model + "_step_expected.safetensors"), test::fixture(model));
}

// QLoRA step parity: a PEFT adapter on all seven projections trained over hf_odd quantized to
// NF4 with double-quantized statistics, against PEFT over bitsandbytes' NF4 round trip of each
// Linear (tests/fixtures/make_qlora_fixtures.py): the adapters' gradients after one
// forward/backward and ten clipped AdamW steps' losses, at 1, 2 and 3 ranks (the 4-bit bytes
// sharded and all-gathered), with and without activation checkpointing.
TEST(Dist, QloraStepParityWithPeftOverBitsandbytesNf4AtOneTwoAndThreeRanks) {
  expect_step_parity("QLoRA on hf_odd", test::fixture("qlora_step_expected.safetensors"), test::fixture("hf_odd"),
                     " --qlora " + test::fixture("qlora_adapter"));
}

// Every family trains the same at any world size in every mode — fp32, mixed, bf16, bf16 with
// stochastic rounding, 8-bit AdamW, LoRA on every projection, QLoRA — from its Hugging Face
// fixture (biases, q/k norms, odd shapes): np 1 and 2 without activation checkpointing and np 3
// with it give the same four losses (bf16 compute within its rounding of differently shaped
// micro-batches; fp32 within 1e-5).
TEST(Dist, EveryFamilyTrainsTheSameInEveryModeAtOneToThreeRanks) {
  const std::string adapters =
      "--set lora.enabled=true --set lora.rank=4 --set optimizer.lr=1e-2 "
      "--set lora.targets='[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]' ";
  const std::vector<std::pair<std::string, double>> modes{
      {"", 1e-5},
      {"--set precision.mode=mixed", 1e-3},
      {"--set precision.mode=bf16", 1e-3},
      {"--set precision.mode=bf16 --set precision.stochastic_rounding=true", 1e-3},
      {"--set precision.mode=bf16 --set optimizer.name=adamw8bit", 1e-3},
      {adapters, 1e-5},
      {adapters + "--set quant.base=nf4", 1e-5}};
  for (const std::string family : {"hf_llama_bias", "hf_qwen2", "hf_qwen3", "hf_mistral"}) {
    const std::string model = "hf_path = \"" + test::fixture(family) + "\"\n";
    for (const auto& [mode, tolerance] : modes) {
      SCOPED_TRACE(family + " " + mode);
      test::TempDir dir;
      Runs runs;
      for (int np : {1, 2, 3}) {
        const std::string run = dir / ("np" + std::to_string(np));
        Proc r = train(
            dir, np, run,
            mode + " --set training.steps=4" + (np == 3 ? " --set memory.activation_checkpointing=full" : ""), model);
        ASSERT_EQ(r.rc, 0) << r.output;
        runs[np] = {run, metrics(run)};
      }
      expect_same_curve(runs, 4, tolerance);
    }
  }
}

// Shapes no tensor group of which is a multiple of 256 elements train, and train the same, at
// 1 to 4 ranks: a preset resized to hidden 96, 6/2 heads, vocabulary 300 (full fine-tune, also
// with 8-bit AdamW state), and LoRA and QLoRA over the Hugging Face model of that shape
// (tests/fixtures/hf_odd, FFN 211) with adapters on every projection and the output, QLoRA also
// under activation checkpointing.
TEST(Dist, UnalignedShapesTrainAtOneToFourRanks) {
  const std::string odd =
      "--set model.vocab_size=300 --set model.dim=96 --set model.n_heads=6 --set model.n_kv_heads=2 ";
  const std::string lora =
      "--set lora.enabled=true --set lora.rank=4 --set optimizer.lr=1e-2 "
      "--set lora.targets='[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\",\"output\"]' ";
  const std::string hf_model = "hf_path = \"" + test::fixture("hf_odd") + "\"\n";
  struct Case {
    std::string flags, model;
    std::vector<int> nps;
  };
  const std::vector<Case> cases{
      {odd, test::kSmallModel, {1, 2, 3, 4}},
      {odd + "--set optimizer.name=adamw8bit", test::kSmallModel, {1, 3}},
      {lora, hf_model, {1, 2, 3}},
      {lora + "--set quant.base=nf4", hf_model, {1, 2, 3}},
      {lora + "--set quant.base=nf4 --set memory.activation_checkpointing=full", hf_model, {1, 3}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.flags + " " + c.model);
    test::TempDir dir;
    auto runs = runs_at(dir, c.flags + " --set training.steps=10", c.nps, c.model);
    expect_same_curve(runs, 10, 1e-5);
    for (auto& [np, run] : runs)
      EXPECT_LT(run.second[10]["loss"].get<double>(), run.second[1]["loss"].get<double>() - 0.1)
          << "np=" << np << ": loss must fall";
  }
}

// data.cache at np = 3: rank 0 tokenizes the JSONL file into the cache while the others wait,
// then every rank maps it; a second run maps it and trains the same losses. A malformed record
// stops every rank with exit 2 naming FILE:LINE (rank 0 found it; the others do not hang).
// A build that outlasts parallel.timeout_s does not look like a dead rank.
TEST(Dist, RankZeroTokenizesIntoTheSampleCacheAndEveryRankMapsIt) {
  test::TempDir dir;
  const std::string data = test::chat_jsonl(dir / "chats.jsonl", 150);
  const std::string model = "hf_path = \"" + test::fixture("hf_chat") + "\"\n";
  const std::string flags =
      "--set data.format=jsonl --set data.seq_len=96 --set training.steps=4 "
      "--set data.cache_dir=" +
      (dir / "cache") + " --set data.path=";
  Proc built = train(dir, 3, dir / "built", flags + data, model);
  ASSERT_EQ(built.rc, 0) << built.output;
  EXPECT_NE(built.output.find("into the cache " + (dir / "cache")), std::string::npos) << built.output;
  EXPECT_EQ(built.output.find("tokenizing here"), std::string::npos) << built.output;  // nobody else tokenized
  Proc mapped = train(dir, 3, dir / "mapped", flags + data, model);
  ASSERT_EQ(mapped.rc, 0) << mapped.output;
  EXPECT_NE(mapped.output.find("mapped from the cache"), std::string::npos) << mapped.output;
  const auto a = metrics(dir / "built"), b = metrics(dir / "mapped");
  ASSERT_EQ(a.size(), 4u);
  for (const auto& [step, m] : a) EXPECT_EQ(m["loss"].get<double>(), b.at(step)["loss"].get<double>()) << step;

  // `generate` reads the np = 3 checkpoint at world size 1: the same tokens as from its export.
  test::write_text(dir / "ids.jsonl", "{\"ids\": [5, 17, 300, 2, 41]}\n{\"ids\": [900]}\n");
  const std::string gen = bin() + " generate --config " + test::small_config(dir, "", 60000, model) + " " + flags +
                          data + " --set data.tokenizer=" + test::fixture("hf_chat") + " --in " + (dir / "ids.jsonl") +
                          " --max-new-tokens 12 --out ";
  Proc sharded = sh(gen + (dir / "sharded.jsonl") + " --checkpoint " + (dir / "built/checkpoints/step_4"));
  ASSERT_EQ(sharded.rc, 0) << sharded.output;
  Proc exported = sh(bin() + " export --checkpoint " + (dir / "built/checkpoints/step_4") + " --out " + (dir / "hf"));
  ASSERT_EQ(exported.rc, 0) << exported.output;
  Proc whole = sh(gen + (dir / "whole.jsonl") + " --set model.hf_path=" + (dir / "hf"));
  ASSERT_EQ(whole.rc, 0) << whole.output;
  std::ifstream from_shards(dir / "sharded.jsonl"), from_export(dir / "whole.jsonl");
  int answers = 0;
  for (std::string x, y; std::getline(from_shards, x) && std::getline(from_export, y); ++answers)
    EXPECT_EQ(json::parse(x)["ids"], json::parse(y)["ids"]);
  EXPECT_EQ(answers, 2);

  // A build longer than parallel.timeout_s: the waiting ranks hear from rank 0 after each
  // block (16 MiB, half a second here), so nobody is declared dead.
  std::string big;
  for (int i = 0; big.size() < (size_t{128} << 20); ++i)
    big += "{\"text\": \"record " + std::to_string(i) + std::string(400 + i % 300, 'x') + " model\"}\n";
  test::write_text(dir / "big.jsonl", big);
  Proc slow = train(dir, 2, dir / "slow", flags + (dir / "big.jsonl") + " --set parallel.timeout_s=1.5", model);
  ASSERT_EQ(slow.rc, 0) << slow.output;
  const std::smatch took = [&] {
    std::smatch m;
    std::regex_search(slow.output, m,
                      std::regex("in ([0-9.]+) s \\([0-9,]+ tokens/s, \\d+ threads?\\) into the cache"));
    return m;
  }();
  ASSERT_FALSE(took.empty()) << slow.output;
  EXPECT_GT(std::stod(took[1]), 1.5) << "the build did not outlast the timeout: the check proves nothing";

  test::write_text(dir / "bad.jsonl", read_text_file(data) + "{\"messages\": [}\n");
  Proc bad = train(dir, 3, dir / "bad", flags + (dir / "bad.jsonl"), model);
  EXPECT_EQ(bad.rc, 2) << bad.output;  // (a hang would be timeout's 124)
  EXPECT_NE(bad.output.find("bad.jsonl:151: not valid JSON"), std::string::npos) << bad.output;
}
