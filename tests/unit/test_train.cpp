// End-to-end training on a small model: the loss falls, resume is bit-exact (also with 8-bit
// state), checkpoints are discovered / pruned safely and refuse another model, export -> HF
// import is exact, eval is deterministic, checkpointing and optimizer-in-backward train as the
// plain step does, prefetching keeps results.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "app/export.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "common/alloc_meter.h"
#include "common/error.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/parquet.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"
#include "quant/nf4.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/decode.h"
#include "train/memory.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ptrain;
namespace fs = std::filesystem;
using test::last_line;
using test::load;
using test::losses;

TEST(Train, LossFallsOver200Steps) {
  test::TempDir dir;
  Config c =
      load(test::small_config(dir), {"training.steps=200", "training.log_every=10", "checkpoint.save_final=false"});
  ASSERT_EQ(train(c), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  ASSERT_EQ(l.count(1), 1u);
  ASSERT_EQ(l.count(200), 1u);
  EXPECT_NEAR(l[1], std::log(256.0), 0.3);  // a fresh model is close to uniform over bytes
  EXPECT_LT(l[200], 0.5 * l[1]) << "start " << l[1] << " end " << l[200];
  for (const char* f : {"metrics.jsonl", "memory.json", "config.resolved.toml"})
    EXPECT_TRUE(fs::exists(dir / ("run/" + std::string(f))));
  // One process communicates nothing.
  for (const char* k : {"comm_all_gather_bytes", "comm_reduce_scatter_bytes", "comm_all_reduce_bytes"})
    EXPECT_EQ(nlohmann::json::parse(last_line(dir / "run/metrics.jsonl"))[k].get<int64_t>(), 0) << k;
  // Measured state bytes (summed from the tensors) equal the `ptrain check` prediction.
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  auto predicted = nlohmann::json::parse(predict_memory(c, 1).to_json());
  EXPECT_EQ(measured, predicted);
  EXPECT_EQ(measured["state_bytes_per_param"].get<double>(), 16.0);
}

TEST(Train, ResumeIsBitExact) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 10\nkeep = 5\n");
  ASSERT_EQ(train(load(cfg)), 0);  // 20 steps straight, checkpoints at 10 and 20
  const std::string straight = dir / "run";
  ASSERT_TRUE(fs::exists(straight + "/checkpoints/step_10/meta.json"));

  // 10 steps (the step_10 checkpoint) + resume + 10 steps, into a separate output dir.
  ASSERT_EQ(train(load(cfg, {"run.output_dir=" + (dir / "resumed"),
                             "checkpoint.resume=" + straight + "/checkpoints/step_10"})),
            0);
  auto a = losses(straight + "/metrics.jsonl"), b = losses(dir / "resumed/metrics.jsonl");
  for (int64_t step = 11; step <= 20; ++step) {
    ASSERT_TRUE(b.count(step)) << step;
    EXPECT_EQ(a[step], b[step]) << "loss differs at step " << step;
  }
  SafetensorsFile pa(straight + "/checkpoints/step_20/model.rank0.safetensors");
  SafetensorsFile pb(dir / "resumed/checkpoints/step_20/model.rank0.safetensors");
  SafetensorsFile oa(straight + "/checkpoints/step_20/optimizer.rank0.safetensors");
  SafetensorsFile ob(dir / "resumed/checkpoints/step_20/optimizer.rank0.safetensors");
  for (const auto& e : pa.entries()) EXPECT_TRUE(at::equal(pa.tensor(e.name), pb.tensor(e.name))) << e.name;
  for (const auto& e : oa.entries()) EXPECT_TRUE(at::equal(oa.tensor(e.name), ob.tensor(e.name))) << e.name;

  // checkpoint.resume = "auto" in a finished run picks step_20 and has nothing left to do.
  ASSERT_EQ(train(load(cfg, {"checkpoint.resume=auto"})), 0);
  EXPECT_EQ(losses(straight + "/metrics.jsonl").size(), 20u);
}

TEST(Checkpoint, LatestSkipsIncompleteAndKeepPrunesOldest) {
  test::TempDir dir;
  const std::string root = dir / "ck";
  for (const char* d : {"step_5", "step_10", "step_15", ".step_20.tmp.1"}) fs::create_directories(root + "/" + d);
  test::write_text(root + "/step_5/meta.json", "{}");
  test::write_text(root + "/step_10/meta.json", "{}");  // step_15 has no meta.json: incomplete
  EXPECT_EQ(fs::path(latest_checkpoint(root)).filename(), "step_10");
  EXPECT_EQ(latest_checkpoint(dir / "none"), "");

  Config c = load(test::small_config(dir));
  auto model = build_model(c, at::kCPU, test::local_comm());
  std::vector<OptimTarget> targets;
  for (auto& u : model->units(UnitRole::base)) targets.push_back({u.layout.name, u.shard, u.layout.decay_numel});
  AdamW opt(targets, {});
  for (int64_t step : {30, 40}) save_checkpoint(root, *model, opt, {step, 0, ""}, 2, "");
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.insert(e.path().filename());
  // keep = 2 complete checkpoints; the incomplete step_15 and the temp dir are never touched
  EXPECT_EQ(left, (std::set<std::string>{"step_15", ".step_20.tmp.1", "step_30", "step_40"}));
}

// A flipped byte in a tensor of the newest checkpoint is caught by its CRC-32, and
// checkpoint.resume = "auto" resumes from the previous one, warning why — the continuation equal
// to an uninterrupted run. Leftovers of crashed writes are removed at start; a checkpoint a crash
// left moved aside mid-rewrite (.step_N.old, no step_N) is put back. With every checkpoint
// damaged, the run stops naming each, rather than starting fresh over them.
TEST(Checkpoint, AutoResumeSkipsADamagedNewestAndTidiesLeftovers) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 2\nkeep = 5\n");
  ASSERT_EQ(train(load(cfg, {"run.output_dir=" + (dir / "ref"), "training.steps=8"})), 0);
  ASSERT_EQ(train(load(cfg, {"training.steps=6"})), 0);  // checkpoints at 2, 4, 6
  const std::string ck = dir / "run/checkpoints";
  {  // one byte in the middle of step_6's tensor data
    const std::string path = ck + "/step_6/model.rank0.safetensors";
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    const auto at = static_cast<std::streamoff>(8 + header + (fs::file_size(path) - 8 - header) / 2);
    char byte = 0;
    f.seekg(at);
    f.get(byte);
    f.seekp(at);
    f.put(static_cast<char>(byte ^ 0x10));
  }
  fs::create_directories(ck + "/.step_9.tmp");
  test::write_text(ck + "/.step_9.tmp/model.rank0.safetensors", "partial");
  fs::create_directories(ck + "/.step_4.old");  // step_4 exists: a leftover
  testing::internal::CaptureStderr();
  const int rc = train(load(cfg, {"training.steps=8", "checkpoint.resume=auto"}));
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_EQ(rc, 0) << log;
  for (const std::string& want : std::vector<std::string>{
           "skipped: checkpoint '" + ck + "/step_6': 'model.rank0.safetensors' is damaged: its CRC-32 is",
           "resuming from " + ck + "/step_4", "removed " + ck + "/.step_9.tmp", "removed " + ck + "/.step_4.old"})
    EXPECT_NE(log.find(want), std::string::npos) << want << "\n" << log;
  auto ref = losses(dir / "ref/metrics.jsonl"), got = losses(dir / "run/metrics.jsonl");
  for (int64_t step = 5; step <= 8; ++step) EXPECT_EQ(got[step], ref[step]) << "step " << step;
  EXPECT_FALSE(fs::exists(ck + "/.step_9.tmp"));

  // A crash between the two renames of a rewrite: step_8 only as .step_8.old. It is put back.
  fs::rename(ck + "/step_8", ck + "/.step_8.old");
  testing::internal::CaptureStderr();
  ASSERT_EQ(train(load(cfg, {"training.steps=8", "checkpoint.resume=auto"})), 0);
  const std::string log2 = testing::internal::GetCapturedStderr();
  EXPECT_NE(log2.find("put back"), std::string::npos) << log2;
  EXPECT_NE(log2.find("resumed from " + ck + "/step_8"), std::string::npos) << log2;

  // Every checkpoint damaged: refused, naming each.
  for (const auto& e : fs::directory_iterator(ck)) test::write_text(e.path() / "rng.rank0.safetensors", "x");
  try {
    train(load(cfg, {"training.steps=9", "checkpoint.resume=auto"}));
    ADD_FAILURE() << "resumed from damaged checkpoints";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 4 checkpoint(s)"), std::string::npos) << e.what();
  }
}

// A damaged or hand-edited meta.json is refused naming the field — before a zero world size
// divides anything (it used to end the process with SIGFPE) or a negative size allocates.
TEST(Checkpoint, DamagedMetaIsRefusedNamingTheField) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  ASSERT_EQ(train(load(cfg, {"training.steps=2"})), 0);
  const std::string ck = dir / "run/checkpoints/step_2";
  const nlohmann::json good = nlohmann::json::parse(read_text_file(ck + "/meta.json"));
  Config c = load(cfg);
  auto model = build_model(c, at::kCPU, test::local_comm());
  for (const auto& [edit, field] : std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>>{
           {[](nlohmann::json& m) { m["world_size"] = 0; }, "world_size = 0 is outside"},
           {[](nlohmann::json& m) { m["world_size"] = "2"; }, "world_size is not an integer"},
           {[](nlohmann::json& m) { m["shape"]["n_kv_heads"] = 3; }, "shape.n_heads is not a multiple"},
           {[](nlohmann::json& m) { m["shape"]["dim"] = -64; }, "shape.dim = -64 is outside"},
           {[](nlohmann::json& m) { m.erase("step"); }, "step is missing"},
           {[](nlohmann::json& m) { m["shape"]["rope_scaling"]["type"] = "cubic"; },
            "shape.rope_scaling.type = \"cubic\" is not llama3, linear or yarn"},
           {[](nlohmann::json& m) { m["shape"]["rope_scaling"]["type"] = 3; },
            "shape.rope_scaling.type is not a string"},
           {[](nlohmann::json& m) { m["shape"]["rope_scaling"]["truncate"] = "yes"; },
            "shape.rope_scaling.truncate is not true or false"},
           {[](nlohmann::json& m) { m["files"]["model.rank0.safetensors"]["crc32"] = "xyz"; },
            "files.model.rank0.safetensors.crc32 is not 8 hex digits"}}) {
    nlohmann::json bad = good;
    edit(bad);
    test::write_text(ck + "/meta.json", bad.dump());
    TrainProgress progress;
    try {
      load_checkpoint(ck, *model, nullptr, progress);
      ADD_FAILURE() << "accepted: " << field;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("meta.json: " + field), std::string::npos) << e.what();
    }
  }
}

TEST(Checkpoint, RefusesADifferentModel) {
  test::TempDir dir;
  Config c = load(test::small_config(dir));
  auto model = build_model(c, at::kCPU, test::local_comm());
  AdamW opt({}, {});
  const std::string ck = save_checkpoint(dir / "ck", *model, opt, {1, 0, ""}, 1, "");
  Config other = load(test::small_config(dir), {"model.ffn_dim=96"});
  auto m2 = build_model(other, at::kCPU, test::local_comm());
  TrainProgress p;
  try {
    load_checkpoint(ck, *m2, nullptr, p);
    FAIL() << "loaded into a different shape";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("different model shape"), std::string::npos) << e.what();
  }
}

// Optimizer state is resumed only into an optimizer that keeps exactly that state: a Kahan
// compensation, or 8-bit codes, the run does not keep (or lacks) is named, never dropped or
// invented.
TEST(Checkpoint, RefusesOptimizerStateOfOtherSettings) {
  test::TempDir dir;
  const std::vector<std::string> bf16{"precision.mode=bf16", "training.steps=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), bf16.begin(), bf16.end());
    return extra;
  };
  ASSERT_EQ(train(load(test::small_config(dir), with({"precision.kahan_summation=true"}))), 0);
  const std::string kahan = dir / "run/checkpoints/step_2";
  ASSERT_EQ(train(load(test::small_config(dir), with({"run.output_dir=" + (dir / "plain")}))), 0);
  const std::string plain = dir / "plain/checkpoints/step_2";
  for (const auto& [from, sets, named] : std::vector<std::tuple<std::string, std::vector<std::string>, std::string>>{
           {kahan, {}, ".kahan_comp' that this run's optimizer does not keep"},
           {plain, {"precision.kahan_summation=true"}, ".kahan_comp', which this run's optimizer keeps"},
           {plain, {"optimizer.name=adamw8bit"}, "that this run's optimizer does not keep"}}) {
    SCOPED_TRACE(from + " " + (sets.empty() ? "" : sets[0]));
    std::vector<std::string> resume = with(sets);
    resume.insert(resume.end(),
                  {"training.steps=3", "run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + from});
    try {
      train(load(test::small_config(dir), resume));
      FAIL() << "resumed optimizer state of other settings";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("precision.kahan_summation"), std::string::npos) << e.what();
    }
  }
}

TEST(Checkpoint, ExportThenHfImportIsExact) {
  test::TempDir dir;
  Config c = load(test::small_config(dir), {"training.steps=3"});
  ASSERT_EQ(train(c), 0);
  const std::string ck = dir / "run/checkpoints/step_3";
  export_hf(ck, dir / "hf");
  EXPECT_EQ(read_hf_config(dir / "hf").ffn_dim, 160);
  FsdpModel imported(test::plan(read_hf_config(dir / "hf")), PrecisionPolicy{}, at::kCPU, test::local_comm());
  load_weights(imported, HfCheckpoint(dir / "hf").by_name());
  SafetensorsFile saved(ck + "/model.rank0.safetensors");
  for (const auto& u : imported.units(UnitRole::base))
    EXPECT_TRUE(at::equal(u.shard.detach(), saved.tensor(u.layout.name))) << u.layout.name;  // ws 1: no padding
}

TEST(Eval, DeterministicAndEqualToManualWindows) {
  test::TempDir dir;
  Config c = load(test::small_config(dir));
  auto model = build_model(c, at::kCPU, test::local_comm());
  test::write_text(dir / "e.txt", test::synthetic_corpus(33 * 5 + 10, 99));  // 5 full windows of seq_len+1 = 33
  auto data = std::make_shared<TokenData>(dir / "e.txt", "text");
  const TokenData& d = *data;
  const TokenRows rows(data, Split{0, 0}, Split{0, d.size()}, 32, 1);
  EvalResult r1 = evaluate(*model, rows, 2, 0);
  EvalResult r2 = evaluate(*model, rows, 3, 5);  // other batching and chunking
  EXPECT_EQ(r1.rows, 5);
  EXPECT_EQ(r1.tokens, 5 * 32);
  EXPECT_NEAR(r1.mean_loss, r2.mean_loss, 1e-6);
  std::vector<int64_t> starts{0, 33, 66, 99, 132};
  at::Tensor w = windows_at(d, starts, 33);
  LossSum s = model->eval_loss(w.narrow(1, 0, 32), w.narrow(1, 1, 32), 0);
  EXPECT_NEAR(r1.mean_loss, s.sum / s.tokens, 1e-6);
  EXPECT_NEAR(r1.perplexity, std::exp(r1.mean_loss), 1e-9);
  // TRL's SFT metrics over the same tokens (training.token_metrics): the mean entropy of the
  // next-token distribution and the share of targets that are its first argmax, from the logits
  EXPECT_TRUE(std::isnan(r1.entropy) && std::isnan(r1.mean_token_accuracy));
  const EvalResult r3 = evaluate(*model, rows, 3, 5, -1, /*token_metrics=*/true);
  EXPECT_NEAR(r3.mean_loss, r1.mean_loss, 1e-6);
  const at::Tensor logp = at::log_softmax(model->logits(w.narrow(1, 0, 32)).to(at::kDouble), -1);
  const at::Tensor targets = w.narrow(1, 1, 32).reshape({-1});
  EXPECT_NEAR(r3.entropy, -(logp.exp() * logp).sum(-1).mean().item<double>(), 1e-5);
  // (the untrained model hits no target here: ChunkedLoss.SumsTheUnmaskedTokensEntropyAndTopOneHits counts hits)
  EXPECT_DOUBLE_EQ(r3.mean_token_accuracy, logp.argmax(-1).eq(targets).to(at::kDouble).mean().item<double>());
}

TEST(Train, ActivationCheckpointingTrainsIdentically) {
  test::TempDir dir;
  const std::vector<std::string> base{"training.steps=5", "checkpoint.save_final=false"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), base.begin(), base.end());
    return load(test::small_config(dir), extra);
  };
  ASSERT_EQ(train(with({})), 0);
  ASSERT_EQ(train(with({"memory.activation_checkpointing=full", "run.output_dir=" + (dir / "ac")})), 0);
  auto a = losses(dir / "run/metrics.jsonl"), b = losses(dir / "ac/metrics.jsonl");
  ASSERT_EQ(a.size(), 5u);
  // Recomputation runs the same ops on the same values: the same losses, to rounding.
  for (const auto& [step, loss] : a) EXPECT_NEAR(b[step], loss, 1e-6 * std::abs(loss)) << "step " << step;
}

TEST(Train, OptimizerInBackwardMatchesStepAfterBackward) {
  test::TempDir dir;
  const std::vector<std::string> base{"training.steps=6", "training.max_grad_norm=0", "checkpoint.save_final=false"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), base.begin(), base.end());
    return load(test::small_config(dir), extra);
  };
  ASSERT_EQ(train(with({})), 0);
  Config in_bwd = with({"optimizer.in_backward=true", "run.output_dir=" + (dir / "inbwd")});
  ASSERT_EQ(train(in_bwd), 0);
  auto a = losses(dir / "run/metrics.jsonl"), b = losses(dir / "inbwd/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // the same update, applied per unit during backward
  // No full set of gradients is ever kept: measured and predicted grad bytes are 0.
  auto measured = nlohmann::json::parse(read_text_file(dir / "inbwd/memory.json"));
  EXPECT_EQ(measured["grad_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(in_bwd, 1).to_json()));
}

// bf16 + stochastic rounding + adamw8bit, and bf16 with Kahan summation, resume bit-exactly:
// codes, absmax, float32 moments, the Kahan compensation (checkpointed with the moments), bf16
// parameters and the rounding stream all continue where they stopped.
TEST(Train, AdamW8bitBf16ResumeIsBitExact) {
  for (const auto& [mode, state_key] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"precision.mode=bf16", "precision.stochastic_rounding=true", "optimizer.name=adamw8bit"},
            ".exp_avg.codes"},
           {{"precision.mode=bf16", "precision.kahan_summation=true"}, ".kahan_comp"}}) {
    SCOPED_TRACE(mode.back());
    test::TempDir dir;
    const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 5\nkeep = 5\n");
    std::vector<std::string> sets = mode;
    sets.push_back("training.steps=10");
    ASSERT_EQ(train(load(cfg, sets)), 0);
    const std::string straight = dir / "run";
    std::vector<std::string> resumed = sets;
    resumed.insert(resumed.end(),
                   {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + straight + "/checkpoints/step_5"});
    ASSERT_EQ(train(load(cfg, resumed)), 0);
    auto a = losses(straight + "/metrics.jsonl"), b = losses(dir / "resumed/metrics.jsonl");
    for (int64_t step = 6; step <= 10; ++step) EXPECT_EQ(a[step], b[step]) << "loss differs at step " << step;
    int with_state = 0;
    for (const std::string kind : {"model", "optimizer"}) {
      SafetensorsFile x(straight + "/checkpoints/step_10/" + kind + ".rank0.safetensors");
      SafetensorsFile y(dir / "resumed/checkpoints/step_10/" + kind + ".rank0.safetensors");
      for (const auto& e : x.entries()) {
        EXPECT_TRUE(at::equal(x.tensor(e.name), y.tensor(e.name))) << e.name;
        with_state += e.name.find(state_key) != std::string::npos;
      }
    }
    EXPECT_GT(with_state, 0) << "no " << state_key << " in the checkpoint";
  }
}

// parallel.prefetch changes when units are gathered, never what is computed: the same loss and
// gradients bit for bit, with two gathered units alive at most (the one computing and the one
// arriving) against one without prefetch. Mixed precision makes every gather a real copy.
TEST(Fsdp, PrefetchKeepsResultsAndAtMostTwoUnitsGathered) {
  test::TempDir dir;
  std::vector<at::Tensor> grads[2];
  double loss[2];
  for (int prefetch : {0, 1}) {
    for (bool ac : {false, true}) {
      Config c = load(test::small_config(dir),
                      {"precision.mode=mixed", std::string("parallel.prefetch=") + (prefetch ? "true" : "false"),
                       std::string("memory.activation_checkpointing=") + (ac ? "full" : "none")});
      auto m = build_model(c, at::kCPU, test::local_comm());
      at::manual_seed(3);
      at::Tensor tokens = at::randint(0, 256, {2, 17}, at::kLong);
      at::Tensor l = m->forward_loss(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16), 0);
      l.backward();
      EXPECT_EQ(m->peak_gathered_units(), prefetch ? 2 : 1) << "prefetch " << prefetch << " ac " << ac;
      if (ac) continue;
      loss[prefetch] = l.item<double>();
      for (auto& u : m->units(UnitRole::base)) grads[prefetch].push_back(u.shard.grad().clone());
    }
  }
  EXPECT_EQ(loss[0], loss[1]);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "unit " << i;
}

namespace {
// The small chat model (tests/fixtures/hf_chat: its own tokenizer.json, vocabulary 1,006) on
// 200 generated chats in a JSONL file; `sets` are added to the overrides that select them.
Config chat_config(const test::TempDir& dir, std::vector<std::string> sets, const std::string& extra = "") {
  test::chat_jsonl(dir / "chats.jsonl", 200);
  const std::string cfg = test::small_config(dir, extra, 60000, "hf_path = \"" + test::fixture("hf_chat") + "\"\n");
  sets.insert(sets.begin(), {"data.format=jsonl", "data.path=" + (dir / "chats.jsonl")});
  return load(cfg, sets);
}
}  // namespace

// data.cache through open_data, as every run opens its data: the first open tokenizes into
// the cache, the next maps it; a changed template, tokenizer.json or data option is another
// cache file, tokenized anew; a damaged cache file is tokenized again, with a warning; the
// rows are the same whichever way they came (their fingerprint hashes every id and flag).
TEST(Train, TheSampleCacheIsBuiltOnceAndRebuiltWhenItsInputsChange) {
  test::TempDir dir;
  const std::string cache = dir / "cache";
  Config c = chat_config(dir, {"data.cache_dir=" + cache, "data.seq_len=128"});
  const auto open = [](const Config& config) {
    RunData d = open_data(config);
    return std::make_pair(d.report.at(0), d.rows->fingerprint());
  };
  const auto files = [&] {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(cache)) out.insert(e.path().string());
    return out;
  };
  const auto [built, rows] = open(c);
  EXPECT_NE(built.find("into the cache " + cache), std::string::npos) << built;
  const auto [mapped, same_rows] = open(c);
  EXPECT_NE(mapped.find("mapped from the cache " + cache), std::string::npos) << mapped;
  EXPECT_EQ(same_rows, rows);
  ASSERT_EQ(files().size(), 1u);
  const std::string cache_file = *files().begin();

  Config in_memory = c;
  in_memory.data.cache = false;
  const auto [held, memory_rows] = open(in_memory);
  EXPECT_NE(held.find("held in memory (data.cache = false)"), std::string::npos) << held;
  EXPECT_EQ(memory_rows, rows);
  EXPECT_EQ(files().size(), 1u);

  Config prompt = c;
  prompt.data.train_on_prompt = true;
  EXPECT_NE(open(prompt).first.find("into the cache"), std::string::npos);
  Config chatml = c;
  chatml.data.chat_template = ChatTemplate::chatml;
  EXPECT_NE(open(chatml).first.find("into the cache"), std::string::npos);
  std::filesystem::create_directory(dir / "tok");
  test::write_text(dir / "tok/tokenizer.json", read_text_file(test::fixture("hf_chat/tokenizer.json")) + "\n");
  Config tokenizer = c;
  tokenizer.data.tokenizer = dir / "tok/tokenizer.json";
  tokenizer.data.chat_template = ChatTemplate::llama3;  // (the copy's directory has no template of its own)
  const auto [retokenized, tokenizer_rows] = open(tokenizer);
  EXPECT_NE(retokenized.find("into the cache"), std::string::npos) << retokenized;
  EXPECT_EQ(tokenizer_rows, rows);  // the same tokens: only the file's bytes changed
  EXPECT_EQ(files().size(), 4u);

  std::string bytes = read_text_file(cache_file);
  bytes[bytes.size() / 3] ^= 0x10;
  test::write_text(cache_file, bytes);
  const auto [repaired, repaired_rows] = open(c);
  EXPECT_NE(repaired.find("into the cache"), std::string::npos) << repaired;
  EXPECT_EQ(repaired_rows, rows);
  EXPECT_NE(open(c).first.find("mapped from the cache"), std::string::npos);
}

// training.sample_prompts (plain text here): at each evaluation the model completes them greedily — the text
// logged at step 4 is what `generate` (complete()) makes of the same prompt from the step-4
// checkpoint — and metrics.jsonl keeps each one.
TEST(Train, SamplePromptsAreCompletedAtEachEvaluation) {
  test::TempDir dir;
  const Config c = chat_config(dir, {"data.seq_len=128", "training.steps=8", "training.eval_every=4",
                                     "optimizer.lr=1e-2", "training.sample_prompts=[\"What is 2 + 2?\", \"the model\"]",
                                     "training.sample_tokens=10", "checkpoint.every_steps=4"});
  ASSERT_EQ(train(c), 0);
  std::map<std::pair<int64_t, int64_t>, std::string> logged;
  std::ifstream in(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.contains("sample"))
      logged[{j["step"].get<int64_t>(), j["sample"].get<int64_t>()}] = j["text"].get<std::string>();
  ASSERT_EQ(logged.size(), 4u);  // steps 4 and 8, two prompts each
  auto model = build_model(c, at::kCPU, test::local_comm());
  TrainProgress progress;
  load_checkpoint(dir / "run/checkpoints/step_4", *model, nullptr, progress);
  const Tokenizer tok(c.tokenizer_path());
  SamplingOptions o;
  o.max_new_tokens = 10;
  for (int64_t i = 0; i < 2; ++i) {
    const Completion done = complete(*model, tok.encode_with_special_tokens(c.training.sample_prompts[i]),
                                     eos_ids(c, &tok, nullptr), o, &tok);
    EXPECT_EQ(done.text, logged.at({4, i})) << "prompt " << i;
    EXPECT_GE(done.ids.size(), 3u) << "prompt " << i << ": too short an answer to tell models apart";
  }
  EXPECT_NE(logged.at({4, 0}), logged.at({8, 0}));  // training went on between the two
  // A sample prompt needs evaluations to be printed at.
  EXPECT_THROW(chat_config(dir, {"training.eval_every=0", "training.sample_prompts=[\"x\"]"}), ConfigError);
}

// A step's loss and gradient are the mean over all its trained tokens, whichever micro-batch
// holds them: 12 rows at once, or 4 rows x 3 accumulated micro-batches (whose trained tokens
// differ), train the same losses; so does packing with a different row count per step... of
// the same rows.
TEST(Train, JsonlStepWeighsEveryTrainedTokenEqually) {
  for (const char* packing : {"false", "true"}) {
    SCOPED_TRACE(std::string("packing = ") + packing);
    test::TempDir dir;
    const std::vector<std::string> base{"training.steps=6", "checkpoint.save_final=false", "data.seq_len=96",
                                        std::string("data.packing=") + packing, "optimizer.lr=1e-2"};
    auto with = [&](const std::string& out, std::vector<std::string> extra) {
      extra.insert(extra.end(), base.begin(), base.end());
      extra.push_back("run.output_dir=" + (dir / out));
      return chat_config(dir, extra);
    };
    ASSERT_EQ(train(with("one", {"data.micro_batch_size=12", "training.grad_accum_steps=1"})), 0);
    ASSERT_EQ(train(with("three", {"data.micro_batch_size=4", "training.grad_accum_steps=3"})), 0);
    auto a = losses(dir / "one/metrics.jsonl"), b = losses(dir / "three/metrics.jsonl");
    ASSERT_EQ(a.size(), 6u);
    for (int64_t step = 1; step <= 6; ++step) EXPECT_NEAR(a[step], b[step], 1e-5 * a[step]) << "step " << step;
    EXPECT_LT(a[6], a[1]);
  }
}

// A dataset without a record says so in its format's words, and a JSON array given as JSONL (or
// JSONL given as one array) is refused naming the format it is.
TEST(Train, EmptyOrMisformattedJsonDatasetsAreRefusedSayingWhy) {
  test::TempDir dir;
  test::write_text(dir / "blank.jsonl", "\n \n");
  test::write_text(dir / "empty.json", "[ ]\n");
  test::write_text(dir / "array.json", " [{\"text\": \"a\"}]\n");
  test::write_text(dir / "lines.jsonl", "{\"text\": \"a\"}\n");
  const std::string cfg = test::small_config(dir, "", 60000, "hf_path = \"" + test::fixture("hf_chat") + "\"\n");
  for (const auto& [file, format, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"blank.jsonl", "jsonl", "has no usable sample: 0 records, 0 longer than seq_len+1"},
           {"blank.jsonl", "jsonl", "(the file holds only blank lines)"},
           {"empty.json", "json", "has no usable sample: 0 records, 0 longer than seq_len+1"},
           {"empty.json", "json", "(the array holds no element)"},
           {"array.json", "jsonl", "starts with '[': it holds one JSON array of records, which data.format = \"json\""},
           {"lines.jsonl", "json", "starts with '{', not '[': records one per line are data.format = \"jsonl\""}}) {
    try {
      (void)open_data(load(cfg, {"data.format=" + format, "data.path=" + (dir / file)}));
      ADD_FAILURE() << file << " accepted as " << format;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// A JSONL run resumes exactly: the checkpoint's row counter is the whole data position.
TEST(Train, JsonlResumeIsExact) {
  test::TempDir dir;
  const std::string extra = "[checkpoint]\nevery_steps = 4\n";
  const std::vector<std::string> sets{"training.steps=8", "data.seq_len=128", "data.packing=true"};
  ASSERT_EQ(train(chat_config(dir, sets, extra)), 0);
  auto resumed = sets;
  resumed.push_back("run.output_dir=" + (dir / "resumed"));
  resumed.push_back("checkpoint.resume=" + (dir / "run/checkpoints/step_4"));
  ASSERT_EQ(train(chat_config(dir, resumed, extra)), 0);
  auto a = losses(dir / "run/metrics.jsonl"), b = losses(dir / "resumed/metrics.jsonl");
  for (int64_t step = 5; step <= 8; ++step) {
    ASSERT_TRUE(b.count(step)) << step;
    EXPECT_EQ(a[step], b[step]) << "loss differs at step " << step;
  }
}

// configs/tiny_chat_qlora.toml as shipped (the data is launch/setup.sh's generated chats): the
// loss on answer tokens starts near uniform over the vocabulary and falls, on held-out chats too.
// configs/tiny_qwen_chat_qlora.toml: a Qwen-shaped model (q/k/v biases, tied embedding), its own
// Qwen-style tokenizer and Qwen2.5 chat template (recognized from its directory), ShareGPT chats
// from a Parquet file: the answer-token loss starts near uniform and falls.
TEST(Train, TinyQwenChatQloraLearnsFromShareGptParquet) {
  if (!parquet_supported()) GTEST_SKIP() << "built without Parquet support (no pyarrow in the venv)";
  const std::string data = test::source_dir() + "/data/tiny_chat_sharegpt.parquet";
  ASSERT_TRUE(fs::exists(data)) << data << " is missing: launch/setup.sh generates it";
  test::TempDir dir;
  Config c = load(test::source_dir() + "/configs/tiny_qwen_chat_qlora.toml",
                  {"run.output_dir=" + (dir / "run"), "model.hf_path=" + test::fixture("hf_qwen_chat"),
                   "data.path=" + data, "checkpoint.save_final=false"});
  ASSERT_EQ(train(c), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  std::vector<double> val;
  std::ifstream in(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) val.push_back(j["val_loss"].get<double>());
  }
  ASSERT_EQ(val.size(), 3u);                // steps 50, 100, 150
  EXPECT_NEAR(l[1], std::log(563.0), 1.0);  // random weights: about uniform over the vocabulary
  EXPECT_LT(val[0], 0.7 * l[1]);
  EXPECT_LT(val[2], val[0]);
  std::cout << "Qwen chat from Parquet, answer-token loss: step 1 " << l[1] << ", val_loss at steps 50/100/150 "
            << val[0] << " / " << val[1] << " / " << val[2] << "\n";
}

TEST(Train, TinyChatQloraLearnsTheAnswers) {
  const std::string data = test::source_dir() + "/data/tiny_chat.jsonl";
  ASSERT_TRUE(fs::exists(data)) << data << " is missing: launch/setup.sh generates it";
  test::TempDir dir;
  Config c = load(test::source_dir() + "/configs/tiny_chat_qlora.toml",
                  {"run.output_dir=" + (dir / "run"), "model.hf_path=" + test::fixture("hf_chat"), "data.path=" + data,
                   "checkpoint.save_final=false"});
  ASSERT_EQ(train(c), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  std::vector<double> val;
  std::ifstream in(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) val.push_back(j["val_loss"].get<double>());
  }
  ASSERT_EQ(val.size(), 3u);                 // steps 50, 100, 150
  EXPECT_NEAR(l[1], std::log(1006.0), 1.0);  // random weights: about uniform over the vocabulary
  EXPECT_LT(val[0], 0.5 * l[1]);
  EXPECT_LT(val[2], val[0]);
  std::cout << "answer-token loss: step 1 " << l[1] << ", val_loss at steps 50/100/150 " << val[0] << " / " << val[1]
            << " / " << val[2] << "\n";
}
