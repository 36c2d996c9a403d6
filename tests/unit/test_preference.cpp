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
    if (c.training.objective == Objective::dpo) EXPECT_NEAR(l.at(1), std::log(2.0), 1e-6) << k.name;  // ref = policy
    const auto last = nlohmann::json::parse(last_line(dir / "run/metrics.jsonl"));
    EXPECT_GT(last["rewards/margins"].get<double>(), 0.0) << k.name;
    EXPECT_EQ(last["pairs"].get<int64_t>(), 8) << k.name;
    auto measured = nlohmann::json::parse(read_text_file(dir / "run/memory.json"));
    EXPECT_EQ(measured, nlohmann::json::parse(predict_memory(c, 1).to_json())) << k.name;
  }
}
