// End-to-end training properties on a small model: the loss falls, resume is bit-exact,
// checkpoints are discovered / pruned safely, export -> HF import is exact, eval is
// deterministic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "common/alloc_meter.h"
#include "common/error.h"
#include "config/config.h"
#include "data/dataset.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "quant/nf4.h"
#include "test_util.h"
#include "train/memory.h"
#include "train/export.h"
#include "train/setup.h"
#include "train/trainer.h"

using namespace ptrain;
namespace fs = std::filesystem;

namespace {
std::map<int64_t, double> losses(const std::string& metrics_path) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("\"loss\"") != std::string::npos) last = line;
  return last;
}

Config load(const std::string& path, std::vector<std::string> sets = {}) { return load_config(path, sets, Environment{}); }
}  // namespace

TEST(Train, LossFallsOver200Steps) {
  test::TempDir dir;
  Config c = load(test::small_config(dir), {"training.steps=200", "training.log_every=10", "checkpoint.save_final=false"});
  ASSERT_EQ(train(c), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  ASSERT_EQ(l.count(1), 1u);
  ASSERT_EQ(l.count(200), 1u);
  EXPECT_NEAR(l[1], std::log(256.0), 0.3);  // a fresh model is close to uniform over bytes
  EXPECT_LT(l[200], 0.5 * l[1]) << "start " << l[1] << " end " << l[200];
  for (const char* f : {"metrics.jsonl", "memory.json", "config.resolved.toml"}) EXPECT_TRUE(fs::exists(dir / ("run/" + std::string(f))));
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
  ASSERT_EQ(train(load(cfg, {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + straight + "/checkpoints/step_10"})), 0);
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
  for (auto& u : model->units()) targets.push_back({u.layout.name, u.shard, u.layout.decay_numel});
  AdamW opt(targets, {});
  for (int64_t step : {30, 40}) save_checkpoint(root, *model, opt, {step, 0}, 2, "");
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(root)) left.insert(e.path().filename());
  // keep = 2 complete checkpoints; the incomplete step_15 and the temp dir are never touched
  EXPECT_EQ(left, (std::set<std::string>{"step_15", ".step_20.tmp.1", "step_30", "step_40"}));
}

TEST(Checkpoint, RefusesADifferentModel) {
  test::TempDir dir;
  Config c = load(test::small_config(dir));
  auto model = build_model(c, at::kCPU, test::local_comm());
  AdamW opt({}, {});
  const std::string ck = save_checkpoint(dir / "ck", *model, opt, {1, 0}, 1, "");
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

TEST(Checkpoint, ExportThenHfImportIsExact) {
  test::TempDir dir;
  Config c = load(test::small_config(dir), {"training.steps=3"});
  ASSERT_EQ(train(c), 0);
  const std::string ck = dir / "run/checkpoints/step_3";
  export_hf(ck, dir / "hf");
  EXPECT_EQ(read_hf_config(dir / "hf").ffn_dim, 160);
  FsdpModel imported(read_hf_config(dir / "hf"), PrecisionPolicy{}, at::kCPU, 0.02, test::local_comm());
  imported.load(HfCheckpoint(dir / "hf").by_name());
  SafetensorsFile saved(ck + "/model.rank0.safetensors");
  for (const auto& u : imported.units()) EXPECT_TRUE(at::equal(u.shard.detach(), saved.tensor(u.layout.name))) << u.layout.name;  // ws 1: no padding
}

TEST(Eval, DeterministicAndEqualToManualWindows) {
  test::TempDir dir;
  Config c = load(test::small_config(dir));
  auto model = build_model(c, at::kCPU, test::local_comm());
  test::write_text(dir / "e.txt", test::synthetic_corpus(33 * 5 + 10, 99));  // 5 full windows of seq_len+1 = 33
  TokenData d(dir / "e.txt", "text");
  EvalResult r1 = evaluate(*model, d, 0, d.size(), 32, 2, 0);
  EvalResult r2 = evaluate(*model, d, 0, d.size(), 32, 3, 5);  // other batching and chunking
  EXPECT_EQ(r1.windows, 5);
  EXPECT_EQ(r1.tokens, 5 * 32);
  EXPECT_NEAR(r1.mean_loss, r2.mean_loss, 1e-6);
  std::vector<int64_t> starts{0, 33, 66, 99, 132};
  at::Tensor w = windows_at(d, starts, 33);
  LossSum s = model->eval_loss(w.narrow(1, 0, 32), w.narrow(1, 1, 32), 0);
  EXPECT_NEAR(r1.mean_loss, s.sum / s.tokens, 1e-6);
  EXPECT_NEAR(r1.perplexity, std::exp(r1.mean_loss), 1e-9);
}

TEST(Precision, MixedComputesInBf16OverFp32Master) {
  test::TempDir dir;
  Config fp32 = load(test::small_config(dir), {"training.steps=1", "checkpoint.save_final=false"});
  Config mixed = load(test::small_config(dir), {"training.steps=1", "checkpoint.save_final=false", "precision.mode=mixed",
                                                "run.output_dir=" + (dir / "mixed")});
  auto m = build_model(mixed, at::kCPU, test::local_comm());
  EXPECT_EQ(m->units()[1].shard.scalar_type(), at::kFloat);
  EXPECT_EQ(m->gather(1).scalar_type(), at::kBFloat16);
  m->release(1);
  ASSERT_EQ(train(fp32), 0);
  ASSERT_EQ(train(mixed), 0);
  const double a = losses(dir / "run/metrics.jsonl")[1], b = losses(dir / "mixed/metrics.jsonl")[1];
  EXPECT_NEAR(a, b, 0.02);  // same init and batch; bf16 compute rounds at ~3 significant digits
  EXPECT_NE(a, b);
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

// Activation offloading (memory.activation_offloading) for a full fine-tune and for QLoRA: the
// same losses bit for bit as checkpointing alone (the recompute reads the same values, brought
// back from the host); forward leaves on the device only what the planner says (the head's
// tensors: every block input is in the offloader's host copies, as many bytes as it predicts),
// and backward hands every host copy back.
TEST(Memory, ActivationOffloadingTrainsIdenticallyAndKeepsInputsOnTheHost) {
  const std::vector<std::string> qlora{"lora.enabled=true", "lora.targets=[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]",
                                       "lora.rank=4", "optimizer.lr=1e-2", "quant.base=\"nf4\""};
  for (const auto& extra : {std::vector<std::string>{}, qlora}) {
    SCOPED_TRACE(extra.empty() ? "full fine-tune" : "QLoRA");
    test::TempDir dir;
    const std::string cfg = test::small_config(dir);
    std::map<bool, std::map<int64_t, double>> curve;
    std::map<bool, int64_t> on_device;
    for (bool offload : {false, true}) {
      std::vector<std::string> sets = extra;
      sets.insert(sets.end(), {"memory.activation_checkpointing=\"full\"", "training.steps=6", "checkpoint.save_final=false",
                               "memory.activation_offloading=" + std::string(offload ? "true" : "false"),
                               "run.output_dir=" + (dir / (offload ? "offload" : "ac"))});
      const Config c = load(cfg, sets);
      ASSERT_EQ(train(c), 0);
      curve[offload] = losses(dir / ((offload ? "offload" : "ac") + std::string("/metrics.jsonl")));
      {  // the run reports the host bytes its offloaded inputs took: one micro-batch's block inputs
        std::ifstream in(dir / ((offload ? "offload" : "ac") + std::string("/metrics.jsonl")));
        std::string line;
        std::getline(in, line);
        EXPECT_EQ(nlohmann::json::parse(line)["offload_host_peak_bytes"].get<int64_t>(),
                  offload ? c.model.shape.n_layers * c.data.micro_batch_size * c.data.seq_len * c.model.shape.dim * 4 : 0);
      }
      auto model = build_model(c, at::kCPU, test::local_comm());
      at::Tensor tokens = at::randint(0, 256, {c.data.micro_batch_size, c.data.seq_len + 1}, at::kLong);
      at::Tensor in = tokens.narrow(1, 0, c.data.seq_len), tgt = tokens.narrow(1, 1, c.data.seq_len);
      model->forward_loss(in, tgt, 0).backward();  // RoPE tables
      model->zero_grad();
      const ActivationEstimate predicted = predict_activations(c.model.shape, activation_inputs(c));
      {
        MeterScope scope;
        at::Tensor loss = model->forward_loss(in, tgt, 0);
        const int64_t host = offload ? model->offloader()->host_bytes() : 0;
        on_device[offload] = scope.meter().net.load() - static_cast<int64_t>(loss.nbytes()) - host;
        EXPECT_EQ(on_device[offload], predicted.saved_bytes());
        EXPECT_EQ(host, predicted.host_bytes);
        loss.backward();
      }
      if (offload) {
        EXPECT_EQ(model->offloader()->host_bytes(), 0) << "backward fetched every input";
        EXPECT_LE(model->offloader()->peak_device_in_flight(), ActivationOffloader::kInFlight);
      }
    }
    ASSERT_EQ(curve[false].size(), 6u);
    for (const auto& [step, loss] : curve[false]) EXPECT_EQ(curve[true][step], loss) << "step " << step;
    const Config c = load(cfg, extra);  // the block inputs [micro-batch, seq_len, dim] in float32, one per block
    const int64_t inputs = c.model.shape.n_layers * c.data.micro_batch_size * c.data.seq_len * c.model.shape.dim * 4;
    EXPECT_EQ(on_device[false] - on_device[true], inputs);
    std::cout << (extra.empty() ? "full fine-tune" : "QLoRA") << ": saved on the device after forward " << on_device[false]
              << " B with checkpointing, " << on_device[true] << " B with offloading\n";
  }
}

// LoRA and QLoRA under activation checkpointing: the recomputed blocks differentiate the
// adapters over the frozen base (and draw the forward's dropout masks again), so training gives
// the same losses as without checkpointing;
// forward keeps only each block's input, measured by the allocation meter and equal to the
// planner's prediction in both cases.
TEST(Lora, ActivationCheckpointingTrainsIdenticallyAndSavesMemory) {
  const std::string all = "[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\",\"output\"]";
  for (const auto& [base, targets, dropout] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"none", all, "0.0"}, {"nf4", all, "0.0"}, {"none", "[\"q\",\"v\",\"up\"]", "0.0"}, {"nf4", all, "0.1"}}) {
    SCOPED_TRACE("quant.base=" + base + " lora.targets=" + targets + " lora.dropout=" + dropout);
    test::TempDir dir;
    const std::string cfg = test::small_config(dir);
    const std::vector<std::string> lora{"lora.enabled=true", "lora.targets=" + targets, "lora.rank=4", "optimizer.lr=1e-2",
                                        "training.steps=6", "checkpoint.save_final=false", "quant.base=\"" + base + "\"",
                                        "lora.dropout=" + dropout};
    std::map<std::string, int64_t> saved;
    std::map<std::string, std::map<int64_t, double>> curve;
    for (const std::string ac : {"none", "full"}) {
      std::vector<std::string> sets = lora;
      sets.insert(sets.end(), {"memory.activation_checkpointing=\"" + ac + "\"", "run.output_dir=" + (dir / ac)});
      const Config c = load(cfg, sets);
      ASSERT_EQ(train(c), 0);
      curve[ac] = losses(dir / (ac + "/metrics.jsonl"));
      auto model = build_model(c, at::kCPU, test::local_comm());
      at::Tensor tokens = at::randint(0, 256, {c.data.micro_batch_size, c.data.seq_len + 1}, at::kLong);
      at::Tensor in = tokens.narrow(1, 0, c.data.seq_len), tgt = tokens.narrow(1, 1, c.data.seq_len);
      model->forward_loss(in, tgt, 0).backward();  // RoPE tables
      model->zero_grad();
      {
        MeterScope scope;
        at::Tensor loss = model->forward_loss(in, tgt, 0);
        saved[ac] = scope.meter().net.load() - static_cast<int64_t>(loss.nbytes());
        loss.backward();
      }
      if (dropout == "0.0") {
        EXPECT_EQ(saved[ac], predict_activations(c.model.shape, activation_inputs(c)).saved_bytes()) << ac;
      }
    }
    ASSERT_EQ(curve["none"].size(), 6u);
    if (dropout == "0.0") {
      for (const auto& [step, loss] : curve["none"]) EXPECT_NEAR(curve["full"][step], loss, 1e-6 * loss) << "step " << step;
    } else {
      // With dropout, compare one step's adapter gradients from the same RNG state: the
      // recompute must draw the forward's masks. (Training curves with dropout are not
      // bit-reproducible on the CPU even without checkpointing.)
      std::map<std::string, std::vector<at::Tensor>> grads;
      at::Tensor tokens = at::randint(0, 256, {4, 33}, at::kLong);
      for (const std::string ac : {"none", "full"}) {
        std::vector<std::string> sets = lora;
        sets.push_back("memory.activation_checkpointing=\"" + ac + "\"");
        auto model = build_model(load(cfg, sets), at::kCPU, test::local_comm());
        at::manual_seed(11);
        model->forward_loss(tokens.narrow(1, 0, 32), tokens.narrow(1, 1, 32), 0).backward();
        for (auto& u : model->trainable_units())
          if (u.shard.grad().defined()) grads[ac].push_back(u.shard.grad().clone());
      }
      ASSERT_EQ(grads["none"].size(), grads["full"].size());
      for (size_t i = 0; i < grads["none"].size(); ++i)
        EXPECT_TRUE(at::allclose(grads["full"][i], grads["none"][i], 1e-5, 1e-7)) << "adapter unit " << i;
    }
    EXPECT_LT(curve["none"][6], curve["none"][1]);
    EXPECT_LT(saved["full"], saved["none"] / 3) << "checkpointing keeps each block's input only";
    std::cout << "LoRA (base " << base << ", targets " << targets << ") saved activations per micro-batch: " << saved["none"] << " B without, "
              << saved["full"] << " B with activation checkpointing\n";
  }
}

TEST(Precision, Bf16ModeDtypesAndStateBytes) {
  test::TempDir dir;
  Config c = load(test::small_config(dir), {"precision.mode=bf16", "training.steps=2", "checkpoint.save_final=false"});
  auto m = build_model(c, at::kCPU, test::local_comm());
  EXPECT_EQ(m->units()[1].shard.scalar_type(), at::kBFloat16);        // sharded params (master)
  EXPECT_EQ(m->gather(1).scalar_type(), at::kBFloat16);               // gathered unit / compute
  m->release(1);
  EXPECT_EQ(m->rope(8).cos.scalar_type(), at::kFloat);                // RoPE tables
  at::Tensor tokens = at::randint(0, 256, {2, 9}, at::kLong);
  EXPECT_EQ(m->logits(tokens.narrow(1, 0, 8)).scalar_type(), at::kFloat);  // logits
  at::Tensor loss = m->forward_loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8), 0);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);                          // loss
  loss.backward();
  EXPECT_EQ(m->units()[1].shard.grad().scalar_type(), at::kBFloat16); // grads
  std::vector<OptimTarget> targets;
  for (auto& u : m->units()) targets.push_back({u.layout.name, u.shard, 0, 0});
  for (const auto& s : make_optimizer(c, *m, targets)->state())
    EXPECT_EQ(s.tensor.scalar_type(), at::kBFloat16) << s.key;        // optimizer moments
  Config c8 = load(test::small_config(dir), {"precision.mode=bf16", "optimizer.name=adamw8bit"});
  for (const auto& s : make_optimizer(c8, *m, targets)->state()) {    // 8-bit: codes, absmax, fp32 moments
    const bool codes = s.key.size() > 6 && s.key.compare(s.key.size() - 6, 6, ".codes") == 0;
    EXPECT_EQ(s.tensor.scalar_type(), codes ? at::kByte : at::kFloat) << s.key;
  }
  ASSERT_EQ(train(c), 0);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json()));
  EXPECT_EQ(measured["state_bytes_per_param"].get<double>(), 8.0);    // 2 + 2 + 2 x 2
}

TEST(Precision, Bf16StochasticRoundingIsReproducibleAndLearns) {
  test::TempDir dir;
  auto run = [&](const std::string& out, const std::string& sr) {
    return train(load(test::small_config(dir), {"precision.mode=bf16", "precision.stochastic_rounding=" + sr,
                                                "training.steps=60", "checkpoint.save_final=false", "run.output_dir=" + (dir / out)}));
  };
  ASSERT_EQ(run("a", "true"), 0);
  ASSERT_EQ(run("b", "true"), 0);
  ASSERT_EQ(run("c", "false"), 0);
  auto a = losses(dir / "a/metrics.jsonl"), b = losses(dir / "b/metrics.jsonl"), c = losses(dir / "c/metrics.jsonl");
  EXPECT_EQ(a, b);                  // same seed: identical stochastic rounding
  EXPECT_NE(a[60], c[60]);          // and it is really applied
  EXPECT_LT(a[60], 0.75 * a[1]);    // learns
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

// Persistent state per parameter before dividing by the world size, measured from the tensors
// (memory.json) and predicted from the config (`ptrain check`): fp32 16, mixed 16, bf16 8,
// bf16 + adamw8bit 2 + 2 + 2 x (1 + 4/256) = 6.03 plus float32 moments of the tensors under
// 4096 elements (this small model's 64-element norms: 1 block of 256 each).
TEST(Precision, StateBytesPerParameterPerMode) {
  const std::vector<std::pair<std::vector<std::string>, double>> modes{
      {{"precision.mode=fp32"}, 16.0},
      {{"precision.mode=mixed"}, 16.0},
      {{"precision.mode=bf16"}, 8.0},
      {{"precision.mode=bf16", "optimizer.name=adamw8bit", "precision.stochastic_rounding=true"}, 6.03125}};
  for (const auto& [sets, expected] : modes) {
    test::TempDir dir;
    std::vector<std::string> s = sets;
    s.insert(s.end(), {"training.steps=1", "checkpoint.save_final=false"});
    Config c = load(test::small_config(dir), s);
    ASSERT_EQ(train(c), 0);
    auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
    EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json())) << sets[0];
    const double per_param = measured["state_bytes_per_param"].get<double>();
    if (expected != 6.03125) {
      EXPECT_EQ(per_param, expected) << sets[0];
      continue;
    }
    // float32 moments for 5 norm groups (2 per block, final norm): 5 blocks x 256 x 8 bytes,
    // less the 8-bit codes and absmax those blocks also carry.
    const int64_t n = measured["num_params"];
    EXPECT_NEAR(per_param, expected + 5.0 * 256 * 8 / static_cast<double>(n), 1e-12);
  }
}

// bf16 + stochastic rounding + adamw8bit resumes bit-exactly: codes, absmax, float32 moments,
// bf16 parameters and the rounding stream all continue where they stopped.
TEST(Train, AdamW8bitBf16ResumeIsBitExact) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 5\nkeep = 5\n");
  const std::vector<std::string> mode{"precision.mode=bf16", "precision.stochastic_rounding=true",
                                      "optimizer.name=adamw8bit", "training.steps=10"};
  ASSERT_EQ(train(load(cfg, mode)), 0);
  const std::string straight = dir / "run";
  std::vector<std::string> resumed = mode;
  resumed.insert(resumed.end(), {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + straight + "/checkpoints/step_5"});
  ASSERT_EQ(train(load(cfg, resumed)), 0);
  auto a = losses(straight + "/metrics.jsonl"), b = losses(dir / "resumed/metrics.jsonl");
  for (int64_t step = 6; step <= 10; ++step) EXPECT_EQ(a[step], b[step]) << "loss differs at step " << step;
  for (const std::string kind : {"model", "optimizer"}) {
    SafetensorsFile x(straight + "/checkpoints/step_10/" + kind + ".rank0.safetensors");
    SafetensorsFile y(dir / "resumed/checkpoints/step_10/" + kind + ".rank0.safetensors");
    for (const auto& e : x.entries()) EXPECT_TRUE(at::equal(x.tensor(e.name), y.tensor(e.name))) << e.name;
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
      Config c = load(test::small_config(dir), {"precision.mode=mixed", std::string("parallel.prefetch=") + (prefetch ? "true" : "false"),
                                                 std::string("memory.activation_checkpointing=") + (ac ? "full" : "none")});
      auto m = build_model(c, at::kCPU, test::local_comm());
      at::manual_seed(3);
      at::Tensor tokens = at::randint(0, 256, {2, 17}, at::kLong);
      at::Tensor l = m->forward_loss(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16), 0);
      l.backward();
      EXPECT_EQ(m->peak_gathered_units(), prefetch ? 2 : 1) << "prefetch " << prefetch << " ac " << ac;
      if (ac) continue;
      loss[prefetch] = l.item<double>();
      for (auto& u : m->units()) grads[prefetch].push_back(u.shard.grad().clone());
    }
  }
  EXPECT_EQ(loss[0], loss[1]);
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(at::equal(grads[0][i], grads[1][i])) << "unit " << i;
}

// LoRA over a frozen base through the same FSDP units: step 0 is exactly the base model (B is
// zero), only adapter parameters get gradients and optimizer state, the base never changes,
// the loss falls, memory.json equals the prediction, and resume is bit-exact.
TEST(Lora, StartsAsBaseTrainsOnlyAdaptersAndResumes) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir, "[checkpoint]\nevery_steps = 10\nkeep = 5\n");
  const std::vector<std::string> lora{"lora.enabled=true", "lora.targets=[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]",
                                      "lora.rank=4", "optimizer.lr=1e-2"};
  Config base_cfg = load(cfg), lora_cfg = load(cfg, lora);
  auto base = build_model(base_cfg, at::kCPU, test::local_comm());
  auto adapted = build_model(lora_cfg, at::kCPU, test::local_comm());
  at::manual_seed(3);
  at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  EXPECT_TRUE(at::equal(base->logits(tokens), adapted->logits(tokens)));
  for (size_t i = 0; i < base->units().size(); ++i) {
    EXPECT_FALSE(adapted->units()[i].shard.requires_grad());
    EXPECT_TRUE(at::equal(adapted->units()[i].shard, base->units()[i].shard)) << i;
  }

  ASSERT_EQ(train(lora_cfg), 0);  // 20 steps, checkpoints at 10 and 20
  auto l = losses(dir / "run/metrics.jsonl");
  // The frozen random base alone stays at its step-1 loss (5.49 here, ~log 256 minus little);
  // the adapters (under a fifth of the base's parameters at rank 4) must take it well below.
  EXPECT_LT(l[20], l[1] - 0.2);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(lora_cfg, 1).to_json()));
  EXPECT_EQ(measured["frozen_base_bytes"].get<int64_t>(), base->num_params() * 4);
  EXPECT_LT(measured["num_params"].get<int64_t>(), base->num_params() / 5);
  SafetensorsFile saved(dir / "run/checkpoints/step_20/model.rank0.safetensors");
  for (const auto& e : saved.entries()) EXPECT_NE(e.name.find(".lora"), std::string::npos) << e.name;  // adapters only

  std::vector<std::string> resumed = lora;
  resumed.insert(resumed.end(), {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + (dir / "run/checkpoints/step_10")});
  ASSERT_EQ(train(load(cfg, resumed)), 0);
  auto r = losses(dir / "resumed/metrics.jsonl");
  for (int64_t step = 11; step <= 20; ++step) EXPECT_EQ(r[step], l[step]) << step;
  // A LoRA checkpoint is refused by a full-model config, naming the mismatch.
  try {
    Config full = load(cfg, {"run.output_dir=" + (dir / "x"), "checkpoint.resume=" + (dir / "run/checkpoints/step_10")});
    train(full);
    ADD_FAILURE() << "accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("lora.enabled"), std::string::npos) << e.what();
  }
}

// QLoRA through the trainer: an NF4 base (every block's matrices) + LoRA. At step 0 the model
// equals a dense LoRA model whose base matrices are the NF4 weights dequantized; it trains;
// memory.json equals `ptrain check`'s prediction, with 0.516 bytes per 4-bit weight under
// double quantization and 0.5625 without (plus alignment padding).
TEST(Qlora, Nf4BaseTrainsAndEqualsItsDequantizedDenseModel) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  const std::vector<std::string> lora{"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"o\",\"down\"]", "lora.rank=4",
                                      "optimizer.lr=1e-2"};
  std::vector<std::string> q = lora;
  q.push_back("quant.base=\"nf4\"");
  Config qc = load(cfg, q), dc = load(cfg, lora);
  auto qm = build_model(qc, at::kCPU, test::local_comm());
  auto dm = build_model(dc, at::kCPU, test::local_comm());
  // The dense model's base matrices <- the NF4 model's dequantized matrices.
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < dm->units().size(); ++i) {
      const UnitLayout& layout = dm->units()[i].layout;
      if (layout.kind != UnitKind::block) continue;
      const auto groups = block_matrix_groups(layout);
      ASSERT_EQ(groups.size(), 4u);
      for (int g = 0; g < 4; ++g) {
        ASSERT_NE(qm->nf4_weight(i, g), nullptr);
        at::Tensor w = nf4::dequantize(*qm->nf4_weight(i, g), at::kFloat).reshape({-1});
        dm->units()[i].shard.narrow(0, groups[g].front().offset, w.numel()).copy_(w);
      }
    }
  }
  at::manual_seed(3);
  at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  EXPECT_TRUE(at::allclose(qm->logits(tokens), dm->logits(tokens), 1e-5, 1e-6));
  ASSERT_EQ(train(qc), 0);
  auto l = losses(dir / "run/metrics.jsonl");
  EXPECT_LT(l[20], l[1] - 0.2);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(qc, 1).to_json()));
  // The format's bytes per weight (4 bits + a float32 absmax per 64, or with double quantization
  // an 8-bit absmax per 64 + a float32 per 256 x 64), plus at most the alignment padding of each
  // block's byte unit: kUnitAlign at its end and kByteAlign after each of its 12 parts.
  const double params = measured["nf4_params"].get<double>();
  const double padding = qc.model.shape.n_layers * (kUnitAlign + 12 * nf4::kByteAlign) / params;
  const double dq = 0.5 + 1.0 / 64 + 4.0 / (64 * 256), plain_format = 0.5 + 4.0 / 64;
  EXPECT_GE(measured["nf4_bytes_per_param"].get<double>(), dq);
  EXPECT_LE(measured["nf4_bytes_per_param"].get<double>(), dq + padding);
  q.push_back("quant.double_quant=false");
  auto plain = nlohmann::json::parse(predict_memory(load(cfg, q), 1).to_json());
  EXPECT_GE(plain["nf4_bytes_per_param"].get<double>(), plain_format);
  EXPECT_LE(plain["nf4_bytes_per_param"].get<double>(), plain_format + padding);
}

// PEFT: an adapter saved by PEFT 0.21.2 over hf_tiny (tests/fixtures/make_peft_fixtures.py)
// loaded through lora.adapter_path gives PEFT's logits; a ptrain LoRA checkpoint exports to
// PEFT's files and key names and loads back exactly.
TEST(Peft, ImportMatchesPeftLogitsAndExportRoundTrips) {
  test::TempDir dir;
  const std::string base = test::fixture("hf_tiny"), peft = test::fixture("peft_tiny");
  test::small_config(dir);  // writes the corpus
  test::write_text(dir / "peft.toml", "[model]\nhf_path = \"" + base + "\"\n[data]\npath = \"" + (dir / "corpus.txt") +
                                          "\"\nseq_len = 24\n[training]\ndevice = \"cpu\"\n[lora]\nenabled = true\n"
                                          "targets = [\"q\", \"v\", \"down\"]\nrank = 4\nalpha = 8.0\nadapter_path = \"" + peft + "\"\n");
  Config c = load(dir / "peft.toml");
  auto m = build_model(c, at::kCPU, test::local_comm());
  SafetensorsFile expected(test::fixture("peft_tiny_expected.safetensors"));
  at::Tensor logits = m->logits(expected.tensor("tokens")).view({2, 24, 256});
  EXPECT_LE((logits - expected.tensor("logits")).abs().max().item<double>(), 1e-4);
  // Without the adapter the logits differ (the adapter is not a no-op).
  Config plain = load(dir / "peft.toml", {"lora.adapter_path=\"\""});
  EXPECT_GT((build_model(plain, at::kCPU, test::local_comm())->logits(expected.tensor("tokens")).view({2, 24, 256}) -
             expected.tensor("logits")).abs().max().item<double>(), 1e-3);

  // Export: train a LoRA checkpoint (small config), export it, compare files and reload.
  test::TempDir d2;
  Config t = load(test::small_config(d2), {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"down\"]", "lora.rank=4",
                                          "training.steps=3", "optimizer.lr=1e-2"});
  ASSERT_EQ(train(t), 0);
  const std::string ck = d2 / "run/checkpoints/step_3";
  export_hf(ck, d2 / "peft");
  PeftAdapter a = read_peft(d2 / "peft");
  EXPECT_EQ(a.rank, 4);
  EXPECT_EQ(a.alpha, 16.0);
  SafetensorsFile mine(d2 / "peft/adapter_model.safetensors"), theirs(peft + "/adapter_model.safetensors");
  std::set<std::string> mine_keys, their_keys;
  for (const auto& e : mine.entries()) mine_keys.insert(e.name);
  for (const auto& e : theirs.entries()) their_keys.insert(e.name);
  EXPECT_EQ(mine_keys, their_keys);  // the same modules at the same 2 layers: PEFT's key names
  Config back = load(test::small_config(d2), {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"down\"]", "lora.rank=4",
                                             "lora.adapter_path=\"" + (d2 / "peft") + "\""});
  auto reloaded = build_model(back, at::kCPU, test::local_comm());
  SafetensorsFile saved(ck + "/model.rank0.safetensors");
  for (const auto& u : reloaded->trainable_units())
    if (u.layout.numel > 0) {
      EXPECT_TRUE(at::equal(u.shard.detach(), saved.tensor(u.layout.name))) << u.layout.name;
    }
}

// export --merge: the adapters folded into the base (dense, or NF4 dequantized) give a plain
// HF model whose logits equal the adapted model's.
TEST(Lora, MergedExportEqualsTheAdaptedModel) {
  for (const std::string base : {"none", "nf4"}) {
    test::TempDir dir;
    Config c = load(test::small_config(dir), {"lora.enabled=true", "lora.targets=[\"q\",\"v\",\"o\",\"down\",\"output\"]", "lora.rank=4",
                                              "training.steps=3", "optimizer.lr=1e-2", "quant.base=\"" + base + "\""});
    ASSERT_EQ(train(c), 0);
    const std::string ck = dir / "run/checkpoints/step_3";
    export_merged(ck, dir / "merged");
    auto adapted = build_model(c, at::kCPU, test::local_comm());
    TrainProgress progress;
    load_checkpoint(ck, *adapted, nullptr, progress);
    FsdpModel merged(read_hf_config(dir / "merged"), PrecisionPolicy{}, at::kCPU, 0.02, test::local_comm());
    merged.load(HfCheckpoint(dir / "merged").by_name());
    at::manual_seed(4);
    at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
    at::Tensor want = adapted->logits(tokens), got = merged.logits(tokens);
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-4) << base;
    // and the adapters did move the model away from its base
    auto fresh = build_model(load(test::small_config(dir), {"quant.base=\"none\""}), at::kCPU, test::local_comm());
    if (base == "none") {
      EXPECT_GT((fresh->logits(tokens) - want).abs().max().item<double>(), 1e-3);
    }
  }
}
