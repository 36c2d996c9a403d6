// Precision modes through the trainer: mixed computes in bf16 over fp32 masters, pure bf16
// keeps fp32 logits/loss/RoPE, stochastic rounding is reproducible and learns, and the state
// bytes per parameter of every mode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "quant/nf4.h"
#include "test_util.h"
#include "train/memory.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ptrain;
namespace fs = std::filesystem;
using test::last_line;
using test::load;
using test::losses;

TEST(Precision, MixedComputesInBf16OverFp32Master) {
  test::TempDir dir;
  Config fp32 = load(test::small_config(dir), {"training.steps=1", "checkpoint.save_final=false"});
  Config mixed = load(test::small_config(dir), {"training.steps=1", "checkpoint.save_final=false",
                                                "precision.mode=mixed", "run.output_dir=" + (dir / "mixed")});
  auto m = build_model(mixed, at::kCPU, test::local_comm());
  EXPECT_EQ(m->units(UnitRole::base)[1].shard.scalar_type(), at::kFloat);
  EXPECT_EQ(m->gather({UnitRole::base, 1}).scalar_type(), at::kBFloat16);
  m->release({UnitRole::base, 1});
  ASSERT_EQ(train(fp32), 0);
  ASSERT_EQ(train(mixed), 0);
  const double a = losses(dir / "run/metrics.jsonl")[1], b = losses(dir / "mixed/metrics.jsonl")[1];
  EXPECT_NEAR(a, b, 0.02);  // same init and batch; bf16 compute rounds at ~3 significant digits
  EXPECT_NE(a, b);
}

TEST(Precision, Bf16ModeDtypesAndStateBytes) {
  test::TempDir dir;
  Config c = load(test::small_config(dir), {"precision.mode=bf16", "training.steps=2", "checkpoint.save_final=false"});
  auto m = build_model(c, at::kCPU, test::local_comm());
  EXPECT_EQ(m->units(UnitRole::base)[1].shard.scalar_type(), at::kBFloat16);  // sharded params (master)
  EXPECT_EQ(m->gather({UnitRole::base, 1}).scalar_type(), at::kBFloat16);     // gathered unit / compute
  m->release({UnitRole::base, 1});
  EXPECT_EQ(m->rope(8).cos.scalar_type(), at::kFloat);  // RoPE tables
  at::Tensor tokens = at::randint(0, 256, {2, 9}, at::kLong);
  EXPECT_EQ(m->logits(tokens.narrow(1, 0, 8)).scalar_type(), at::kFloat);  // logits
  at::Tensor loss = m->forward_loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8), 0);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);  // loss
  loss.backward();
  EXPECT_EQ(m->units(UnitRole::base)[1].shard.grad().scalar_type(), at::kBFloat16);  // grads
  std::vector<OptimTarget> targets;
  for (auto& u : m->units(UnitRole::base)) targets.push_back({u.layout.name, u.shard, 0, 0});
  for (const auto& s : make_optimizer(c, *m, targets)->state())
    EXPECT_EQ(s.tensor.scalar_type(), at::kBFloat16) << s.key;  // optimizer moments
  Config c8 = load(test::small_config(dir), {"precision.mode=bf16", "optimizer.name=adamw8bit"});
  for (const auto& s : make_optimizer(c8, *m, targets)->state()) {  // 8-bit: codes, absmax, fp32 moments
    const bool codes = s.key.size() > 6 && s.key.compare(s.key.size() - 6, 6, ".codes") == 0;
    EXPECT_EQ(s.tensor.scalar_type(), codes ? at::kByte : at::kFloat) << s.key;
  }
  ASSERT_EQ(train(c), 0);
  auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
  EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json()));
  EXPECT_EQ(measured["state_bytes_per_param"].get<double>(), 8.0);  // 2 + 2 + 2 x 2
}

TEST(Precision, Bf16StochasticRoundingIsReproducibleAndLearns) {
  test::TempDir dir;
  auto run = [&](const std::string& out, const std::string& sr) {
    return train(load(test::small_config(dir),
                      {"precision.mode=bf16", "precision.stochastic_rounding=" + sr, "training.steps=60",
                       "checkpoint.save_final=false", "run.output_dir=" + (dir / out)}));
  };
  ASSERT_EQ(run("a", "true"), 0);
  ASSERT_EQ(run("b", "true"), 0);
  ASSERT_EQ(run("c", "false"), 0);
  auto a = losses(dir / "a/metrics.jsonl"), b = losses(dir / "b/metrics.jsonl"), c = losses(dir / "c/metrics.jsonl");
  EXPECT_EQ(a, b);                // same seed: identical stochastic rounding
  EXPECT_NE(a[60], c[60]);        // and it is really applied
  EXPECT_LT(a[60], 0.75 * a[1]);  // learns
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
      {{"precision.mode=bf16", "precision.kahan_summation=true"}, 10.0},  // + a bf16 compensation per param
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
