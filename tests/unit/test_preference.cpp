// Preference objectives through the trainer (training.objective dpo / simpo): every precision
// mode and QLoRA trains (the loss falls on a small preference set repeated), with the state
// bytes `ptrain check` plans. That the losses and metrics equal TRL's is sweep.preference_trl's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/fs_util.h"
#include "config/config.h"
#include "test_util.h"
#include "train/memory.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {
// The first `n` pairs of the committed tiny preference set, in a file of their own.
std::string first_pairs(const TempDir& dir, int n) {
  std::ifstream in(source_dir() + "/configs/tiny_preferences.jsonl");
  std::string out, line;
  for (int i = 0; i < n && std::getline(in, line); ++i) out += line + "\n";
  write_text(dir / "pairs.jsonl", out);
  return dir / "pairs.jsonl";
}
}  // namespace

TEST(Preference, EveryPrecisionModeTrainsWithTheStateBytesPlanned) {
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases{
      {"dpo lora fp32", {"precision.mode=fp32", "quant.base=none"}},
      {"dpo lora mixed", {"precision.mode=mixed", "quant.base=none"}},
      {"dpo lora bf16", {"precision.mode=bf16", "quant.base=none"}},
      {"dpo qlora bf16", {}},  // the config as shipped
      {"dpo qlora bf16 adamw8bit", {"optimizer.name=adamw8bit"}},
      {"dpo full mixed precomputed reference",
       {"lora.enabled=false", "quant.base=none", "precision.mode=mixed", "optimizer.lr=1e-3",
        "preference.precompute_ref_log_probs=true"}},
      {"dpo qlora precomputed reference", {"preference.precompute_ref_log_probs=true"}},
      {"simpo full bf16",
       {"training.objective=simpo", "lora.enabled=false", "quant.base=none", "optimizer.lr=1e-3",
        "preference.gamma=0.5"}},
      {"simpo full mixed",
       {"training.objective=simpo", "lora.enabled=false", "quant.base=none", "precision.mode=mixed",
        "optimizer.lr=1e-3"}},
  };
  for (const Case& k : cases) {
    TempDir dir;
    std::vector<std::string> sets{"data.path=" + first_pairs(dir, 8),
                                  "data.micro_batch_size=8",
                                  "data.val_fraction=0",
                                  "data.cache=false",
                                  "training.steps=12",
                                  "training.log_every=1",
                                  "training.eval_every=0",
                                  "training.device=cpu",
                                  "lr_schedule.warmup_steps=0",
                                  "lr_schedule.decay=constant",
                                  "checkpoint.save_final=false",
                                  "run.output_dir=" + (dir / "run")};
    sets.insert(sets.end(), k.sets.begin(), k.sets.end());
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(source_dir());  // the config's paths are the repository's
    Config c = load("configs/tiny_dpo_qlora.toml", sets);
    const int rc = train(c);
    std::filesystem::current_path(cwd);
    ASSERT_EQ(rc, 0) << k.name;
    // the same eight pairs every step: the preference is learned, the loss falls
    const auto l = losses(dir / "run/metrics.jsonl");
    ASSERT_EQ(l.size(), 12u) << k.name;
    EXPECT_LT(l.at(12), l.at(1) - 0.05) << k.name;
    if (c.training.objective == Objective::dpo) {
      EXPECT_NEAR(l.at(1), std::log(2.0), 1e-6) << k.name;  // ref = policy
    }
    const auto last = nlohmann::json::parse(last_line(dir / "run/metrics.jsonl"));
    EXPECT_GT(last["rewards/margins"].get<double>(), 0.0) << k.name;
    EXPECT_EQ(last["pairs"].get<int64_t>(), 8) << k.name;
    auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
    EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json())) << k.name;
  }
}

// A resumed run continues exactly: the same pairs in the same order and the same reference — the
// model as loaded, not the checkpoint (precompute_ref_log_probs scores it again before resuming).
TEST(Preference, AResumedRunContinuesExactly) {
  for (const bool precompute : {false, true}) {
    TempDir dir;
    const std::vector<std::string> common{
        "data.path=" + first_pairs(dir, 40),
        "data.micro_batch_size=4",
        "data.val_fraction=0",
        "data.cache=false",
        "training.steps=8",
        "training.log_every=1",
        "training.eval_every=0",
        "training.device=cpu",
        "precision.mode=fp32",
        "quant.base=none",
        "checkpoint.every_steps=4",
        std::string("preference.precompute_ref_log_probs=") + (precompute ? "true" : "false")};
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(source_dir());
    std::vector<std::string> whole = common, resumed = common;
    whole.push_back("run.output_dir=" + (dir / "whole"));
    resumed.insert(resumed.end(),
                   {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + (dir / "whole/checkpoints/step_4")});
    const Config a = load("configs/tiny_dpo_qlora.toml", whole);
    const int rc_a = train(a);
    int rc_b = -1;
    if (rc_a == 0) rc_b = train(load("configs/tiny_dpo_qlora.toml", resumed));  // its checkpoint exists now
    std::filesystem::current_path(cwd);
    ASSERT_EQ(rc_a, 0);
    ASSERT_EQ(rc_b, 0);
    const auto la = losses(dir / "whole/metrics.jsonl"), lb = losses(dir / "resumed/metrics.jsonl");
    for (int64_t step = 5; step <= 8; ++step) EXPECT_EQ(la.at(step), lb.at(step)) << step << " " << precompute;
    EXPECT_NE(la.at(5), la.at(1));
    // TRL's running count of the ids trained on goes on from the checkpoint's
    const auto na = metric_by_step(dir / "whole/metrics.jsonl", "num_tokens"),
               nb = metric_by_step(dir / "resumed/metrics.jsonl", "num_tokens");
    for (int64_t step = 5; step <= 8; ++step) EXPECT_EQ(na.at(step), nb.at(step)) << step << " " << precompute;
    EXPECT_GT(na.at(5), na.at(4));
  }
}

// KTO (training.objective kto) through the trainer: the eight pairs unpaired into sixteen examples,
// one micro-batch of them (desirable and undesirable); LoRA in each precision mode, QLoRA, a full
// fine-tune against its precomputed reference, apo_zero_unpaired: the loss falls, both labels'
// rewards part, the state bytes are those planned. (The metrics equal TRL's: sweep.kto_trl.)
TEST(Preference, KtoTrainsInEveryModeWithTheStateBytesPlanned) {
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases{
      {"kto lora fp32", {"precision.mode=fp32", "quant.base=none"}},
      {"kto lora bf16", {"precision.mode=bf16", "quant.base=none"}},
      {"kto qlora bf16", {}},
      {"kto full mixed precomputed reference",
       {"lora.enabled=false", "quant.base=none", "precision.mode=mixed", "optimizer.lr=1e-3"}},
      {"apo_zero_unpaired qlora", {"preference.loss_type=apo_zero_unpaired"}},
  };
  for (const Case& k : cases) {
    TempDir dir;
    std::vector<std::string> sets{"data.path=" + first_pairs(dir, 8),
                                  "data.micro_batch_size=16",
                                  "data.val_fraction=0",
                                  "data.cache=false",
                                  "training.objective=kto",
                                  "preference.loss_type=kto",
                                  "training.steps=12",
                                  "training.log_every=1",
                                  "training.eval_every=0",
                                  "training.device=cpu",
                                  "lr_schedule.warmup_steps=0",
                                  "lr_schedule.decay=constant",
                                  "checkpoint.save_final=false",
                                  "run.output_dir=" + (dir / "run")};
    sets.insert(sets.end(), k.sets.begin(), k.sets.end());
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(source_dir());
    Config c = load("configs/tiny_dpo_qlora.toml", sets);
    const int rc = train(c);
    std::filesystem::current_path(cwd);
    ASSERT_EQ(rc, 0) << k.name;
    const auto l = losses(dir / "run/metrics.jsonl");
    ASSERT_EQ(l.size(), 12u) << k.name;
    EXPECT_NEAR(l.at(1), 0.5, 1e-6) << k.name;  // policy = reference: every loss 1 - sigma(0)
    EXPECT_LT(l.at(12), l.at(1) - 0.02) << k.name;
    const auto last = nlohmann::json::parse(last_line(dir / "run/metrics.jsonl"));
    EXPECT_GT(last["rewards/margins"].get<double>(), 0.0) << k.name;
    EXPECT_EQ(last["examples"].get<int64_t>(), 16) << k.name;
    // KTOTrainer logs its KL term always (clamped at 0), 0 for apo_zero_unpaired (no KL sequence scored)
    EXPECT_GE(last["kl"].get<double>(), 0.0) << k.name;
    if (!c.preference.reads(PreferenceLoss::kto)) EXPECT_EQ(last["kl"].get<double>(), 0.0) << k.name;
    EXPECT_FALSE(last.contains("rewards/accuracies")) << k.name;  // not KTOTrainer's
    auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
    EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json())) << k.name;
  }
}

// A resumed KTO run continues exactly: the same blocks of examples in the same order, their KL
// completions, the same reference (scored again before resuming where precomputed).
TEST(Preference, AResumedKtoRunContinuesExactly) {
  for (const bool precompute : {false, true}) {
    TempDir dir;
    const std::vector<std::string> common{
        "data.path=" + first_pairs(dir, 15),  // 30 examples: blocks of 4, the epoch's last of 2
        "data.micro_batch_size=4",
        "data.val_fraction=0",
        "data.cache=false",
        "training.objective=kto",
        "preference.loss_type=kto",
        "training.steps=12",
        "training.log_every=1",
        "training.eval_every=0",
        "training.device=cpu",
        "precision.mode=fp32",
        "quant.base=none",
        "checkpoint.every_steps=5",
        std::string("preference.precompute_ref_log_probs=") + (precompute ? "true" : "false")};
    const auto cwd = std::filesystem::current_path();
    std::filesystem::current_path(source_dir());
    std::vector<std::string> whole = common, resumed = common;
    whole.push_back("run.output_dir=" + (dir / "whole"));
    resumed.insert(resumed.end(),
                   {"run.output_dir=" + (dir / "resumed"), "checkpoint.resume=" + (dir / "whole/checkpoints/step_5")});
    const int rc_a = train(load("configs/tiny_dpo_qlora.toml", whole));
    int rc_b = -1;
    if (rc_a == 0) rc_b = train(load("configs/tiny_dpo_qlora.toml", resumed));
    std::filesystem::current_path(cwd);
    ASSERT_EQ(rc_a, 0);
    ASSERT_EQ(rc_b, 0);
    const auto la = losses(dir / "whole/metrics.jsonl"), lb = losses(dir / "resumed/metrics.jsonl");
    for (int64_t step = 6; step <= 12; ++step) EXPECT_EQ(la.at(step), lb.at(step)) << step << " " << precompute;
    const auto na = metric_by_step(dir / "whole/metrics.jsonl", "num_tokens"),
               nb = metric_by_step(dir / "resumed/metrics.jsonl", "num_tokens");
    for (int64_t step = 6; step <= 12; ++step) EXPECT_EQ(na.at(step), nb.at(step)) << step << " " << precompute;
  }
}
