// Config loading and validation: every file in tests/configs/bad/ must be rejected with its
// problems naming the expected key at the expected line; valid configs, overrides and the
// resolved TOML round trip.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <regex>
#include <vector>

#include "config/config.h"
#include "data/rows.h"
#include "data/samples.h"
#include "model/llama.h"
#include "model/objective.h"
#include "test_util.h"
#include "train/setup.h"

using namespace ptrain;
namespace fs = std::filesystem;

namespace {
// Loads `path` from inside a temp dir holding corpus.txt and data/ (the bad configs' relative
// data paths) and then opens its data, as `ptrain check` does; data.path is supplied by override
// when the file does not set it.
std::vector<ConfigProblem> problems_of(const std::string& path, const Environment& env) {
  test::TempDir dir;
  test::write_text(dir / "corpus.txt", test::synthetic_corpus(20000));
  fs::create_directory_symlink(fs::path(path).parent_path() / "data", dir / "data");
  const auto cwd = fs::current_path();
  fs::current_path(dir.path);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::string> sets;
  if (!std::regex_search(text, std::regex("(^|\n)path *="))) sets.push_back("data.path=corpus.txt");
  std::vector<ConfigProblem> out;
  try {
    const Config c = load_config(path, sets, env);
    open_data(c);
  } catch (const ConfigError& e) {
    out = e.problems;
  }
  fs::current_path(cwd);
  return out;
}
}  // namespace

TEST(ConfigBad, EveryBadConfigIsRejectedNamingItsKey) {
  const fs::path bad = test::source_dir() + "/tests/configs/bad";
  int files = 0;
  for (const auto& entry : fs::directory_iterator(bad)) {
    if (entry.path().extension() != ".toml") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string first;
    std::getline(in, first);
    std::smatch m;
    const std::string header = first;
    ASSERT_TRUE(std::regex_match(header, m, std::regex("# expect: (\\S+) (\\d+)"))) << entry.path();
    const std::string key = m[1];
    const int line = std::stoi(m[2]);
    auto problems = problems_of(entry.path().string(), Environment{/*cuda_available=*/false});
    ASSERT_FALSE(problems.empty()) << entry.path() << " was accepted";
    for (const auto& p : problems) EXPECT_EQ(p.key, key) << entry.path() << ": " << p.str();
    EXPECT_EQ(problems.front().line, line) << entry.path() << ": " << problems.front().str();
    EXPECT_NE(problems.front().str().find("error: " + entry.path().string() + ":"), std::string::npos);
  }
  EXPECT_GE(files, 25);
}

TEST(ConfigBad, UnknownKeySuggestsTheClosestName) {
  auto problems = problems_of(test::source_dir() + "/tests/configs/bad/unknown_key.toml", Environment{});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].reason.find("did you mean training.steps?"), std::string::npos) << problems[0].str();
  problems = problems_of(test::source_dir() + "/tests/configs/bad/misplaced_key.toml", Environment{});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].reason.find("did you mean optimizer.lr?"), std::string::npos) << problems[0].str();
}

// data.fields names the canonical fields the record kinds read — every one of them (the list
// once missed "history").
TEST(ConfigBad, AnUnknownCanonicalFieldIsRefusedListingEveryRecordField) {
  auto problems = problems_of(test::source_dir() + "/tests/configs/bad/fields_unknown_canonical.toml", Environment{});
  ASSERT_FALSE(problems.empty());
  for (const std::string& field : record_fields())
    EXPECT_NE(problems[0].reason.find(field), std::string::npos) << field << ": " << problems[0].str();
}

TEST(ConfigBad, CollectsEveryProblemAtOnce) {
  test::TempDir dir;
  test::write_text(dir / "c.toml", "[training]\nsteps = 0\n[optimizer]\nlr = -1.0\n[data]\npath = \"nope\"\n");
  try {
    load_config(dir / "c.toml", {}, Environment{});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    std::set<std::string> keys;
    for (const auto& p : e.problems) keys.insert(p.key);
    EXPECT_EQ(keys, (std::set<std::string>{"training.steps", "optimizer.lr", "data.path"}));
  }
}

TEST(ConfigBad, OverridesAreCheckedToo) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  try {
    load_config(cfg, {"training.steps=abc", "optimizer.lrr=1"}, Environment{});
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems.size(), 2u);
    EXPECT_EQ(e.problems[0].file, "--set");
    EXPECT_EQ(e.problems[0].line, 1);
    EXPECT_EQ(e.problems[0].key, "training.steps");
    EXPECT_EQ(e.problems[1].key, "optimizer.lrr");
  }
}

// The rules that read one section live beside its options struct (problems()); each is still
// reported by the config at its key's line, alone, and the structs' defaults break none.
TEST(ConfigBad, EachSectionsOwnRulesReportAtTheirKey) {
  for (const OptionProblems& defaults :
       {DataOptions{}.problems(), OptimizerOptions{}.problems(), LrScheduleOptions{}.problems(),
        PrecisionOptions{}.problems(), ParallelOptions{}.problems(), MemoryOptions{}.problems(),
        LoraOptions{}.problems()})
    EXPECT_TRUE(defaults.list().empty()) << defaults.list().front().key;
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"data.micro_batch_size=0"}, "data.micro_batch_size"},
      {{"data.val_fraction=0.6"}, "data.val_fraction"},
      {{"optimizer.lr=0.0"}, "optimizer.lr"},
      {{"optimizer.betas=[0.9, 1.0]"}, "optimizer.betas"},
      {{"optimizer.eps=0.0"}, "optimizer.eps"},
      {{"optimizer.weight_decay=-0.1"}, "optimizer.weight_decay"},
      {{"lr_schedule.warmup_steps=-1"}, "lr_schedule.warmup_steps"},
      {{"lr_schedule.min_lr_ratio=1.5"}, "lr_schedule.min_lr_ratio"},
      {{"precision.param_dtype=bfloat16"}, "precision.param_dtype"},
      {{"precision.reduce_dtype=bfloat16"}, "precision.reduce_dtype"},
      {{"precision.logits_dtype=bfloat16"}, "precision.logits_dtype"},
      {{"precision.allow_bf16_logits=true"}, "precision.allow_bf16_logits"},
      {{"precision.rope_dtype=bfloat16"}, "precision.rope_dtype"},
      {{"precision.stochastic_rounding=true"}, "precision.stochastic_rounding"},
      {{"precision.kahan_summation=true"}, "precision.kahan_summation"},
      {{"precision.mode=bf16", "precision.kahan_summation=true", "precision.stochastic_rounding=true"},
       "precision.kahan_summation"},
      {{"parallel.backend=gloo"}, "parallel.backend"},
      {{"parallel.timeout_s=0.0"}, "parallel.timeout_s"},
      {{"memory.activation_offloading=true"}, "memory.activation_offloading"},
      {{"memory.loss_chunk_tokens=-1"}, "memory.loss_chunk_tokens"},
      {{"lora.rank=0"}, "lora.rank"},
      {{"lora.alpha=0.0"}, "lora.alpha"},
      {{"lora.dropout=1.0"}, "lora.dropout"},
      // a RoPE scaling key that would change nothing is refused, not ignored
      {{"model.rope_scaling_type=\"yarn\""}, "model.rope_scaling_type"},
      {{"model.rope_scaling_factor=4.0", "model.rope_scaling_type=\"cubic\""}, "model.rope_scaling_type"},
      {{"model.rope_scaling_factor=4.0", "model.rope_scaling_type=\"linear\"", "model.rope_low_freq_factor=2.0"},
       "model.rope_low_freq_factor"},
      {{"model.rope_scaling_factor=4.0", "model.rope_scaling_type=\"linear\"", "model.rope_original_max_seq_len=64"},
       "model.rope_original_max_seq_len"},
      {{"model.rope_scaling_factor=0.5", "model.rope_scaling_type=\"yarn\"", "model.rope_original_max_seq_len=64"},
       "model.rope_scaling_factor"},
      {{"model.rope_scaling_factor=4.0", "model.rope_scaling_type=\"yarn\""}, "model.rope_scaling_type"},
  };
  for (const auto& [sets, key] : cases) {
    try {
      load_config(cfg, sets, Environment{});
      ADD_FAILURE() << sets.back() << " accepted";
    } catch (const ConfigError& e) {
      ASSERT_EQ(e.problems.size(), 1u) << sets.back() << ": " << e.what();
      EXPECT_EQ(e.problems[0].key, key) << e.problems[0].str();
      EXPECT_EQ(e.problems[0].file, "--set") << e.problems[0].str();
    }
  }
}

TEST(Config, OverridesPresetAndResolvedTomlRoundTrips) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  Config c = load_config(cfg, {"training.steps=7", "run.name=other", "optimizer.betas=[0.8, 0.9]"}, Environment{});
  EXPECT_EQ(c.training.steps, 7);
  EXPECT_EQ(c.run.name, "other");
  EXPECT_EQ(c.model.shape.dim, 64);          // from the file
  EXPECT_EQ(c.model.shape.head_dim, 16);     // derived: 64 / 4 heads
  EXPECT_EQ(c.model.shape.vocab_size, 256);  // from the tiny preset
  EXPECT_DOUBLE_EQ(c.optimizer.betas[0], 0.8);
  test::write_text(dir / "resolved.toml", to_toml(c));
  Config again = load_config(dir / "resolved.toml", {}, Environment{});
  EXPECT_EQ(to_toml(again), to_toml(c));
}

// YaRN from [model] keys: the attention factor config.json files derive where they give none,
// and the resolved TOML reloads to the same scaling.
TEST(Config, YarnFromModelKeysTakesItsDerivedAttentionFactor) {
  test::TempDir dir;
  const Config c = load_config(
      test::small_config(dir),
      {"model.rope_scaling_factor=4.0", "model.rope_scaling_type=\"yarn\"", "model.rope_original_max_seq_len=32"},
      Environment{});
  const RopeScaling& r = c.model.shape.rope_scaling;
  EXPECT_EQ(r.type, RopeType::yarn);
  EXPECT_DOUBLE_EQ(r.attention_factor, 0.1 * std::log(4.0) + 1);
  EXPECT_DOUBLE_EQ(r.table_scale(), 0.1 * std::log(4.0) + 1);
  EXPECT_EQ(r.original_max_seq_len, 32);
  test::write_text(dir / "resolved.toml", to_toml(c));
  const Config again = load_config(dir / "resolved.toml", {}, Environment{});
  EXPECT_EQ(to_toml(again), to_toml(c));
  EXPECT_TRUE(at::equal(rope_inv_freq(again.model.shape), rope_inv_freq(c.model.shape)));
  EXPECT_DOUBLE_EQ(again.model.shape.rope_scaling.attention_factor, r.attention_factor);
}

// A preset through the config is the preset: its own head_dim (Qwen3's 128 at any width) and
// family survive resolution, and the resolved TOML reloads to the same shape.
TEST(Config, EveryPresetResolvesToItsShape) {
  test::TempDir dir;
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    const Config c =
        load_config(test::small_config(dir, "", 60000, ""), {"model.preset=\"" + name + "\""}, Environment{});
    const LlamaShape want = preset_shape(name).value();
    EXPECT_EQ(c.model.shape.head_dim, want.head_dim);
    EXPECT_EQ(c.model.shape.family, want.family);
    EXPECT_EQ(c.model.shape.total_params(), want.total_params());
    test::write_text(dir / "resolved.toml", to_toml(c));
    EXPECT_EQ(load_config(dir / "resolved.toml", {}, Environment{}).model.shape.total_params(), want.total_params());
  }
}

// preference.ref_model (TRL's ref_model): it turns precompute_ref_log_probs on, and its config is
// the policy's with the reference's path, shape and storage and the policy's tokenizer (a
// reference without one is read); a reference of another vocabulary (the pairs are the policy
// tokenizer's ids), one that is no model, an explicit precompute_ref_log_probs = false and a
// reference-free objective are refused naming the key.
TEST(Config, RefModelIsReadAsAModelOfItsOwnOfThePolicysVocabulary) {
  const auto cwd = fs::current_path();
  fs::current_path(test::source_dir());
  const std::string cfg = "configs/tiny_dpo_qlora.toml";  // hf_chat: Llama, 2 layers, 1006 ids
  test::TempDir dir;
  fs::copy(test::fixture("hf_chat"), dir / "ref", fs::copy_options::recursive);  // (another depth: the sweep)
  fs::remove(dir / "ref/tokenizer.json");  // the reference's tokenizer is not read
  const auto problems = [&](const std::vector<std::string>& sets) {
    try {
      load_config(cfg, sets, Environment{});
    } catch (const ConfigError& e) {
      return e.problems;
    }
    return std::vector<ConfigProblem>{};
  };
  const Config c = load_config(cfg, {"preference.ref_model=\"" + (dir / "ref") + "\""}, Environment{});
  const auto other_vocab = problems({"preference.ref_model=\"tests/fixtures/hf_qwen_chat\""});
  const auto no_model = problems({"preference.ref_model=\"" + (dir / "none") + "\""});
  const auto recompute =
      problems({"preference.ref_model=\"" + (dir / "ref") + "\"", "preference.precompute_ref_log_probs=false"});
  const auto simpo = problems({"preference.ref_model=\"" + (dir / "ref") + "\"", "training.objective=\"simpo\""});
  fs::current_path(cwd);
  EXPECT_TRUE(c.preference.precompute_ref_log_probs);
  EXPECT_EQ(c.model.shape.n_layers, 2);
  const Config ref = reference_config(c);
  EXPECT_EQ(ref.model.hf_path, dir / "ref");
  EXPECT_EQ(ref.model.shape.n_layers, 2);
  EXPECT_EQ(ref.model.shape.vocab_size, c.model.shape.vocab_size);
  EXPECT_EQ(ref.data.tokenizer, "tests/fixtures/hf_chat") << "the policy's tokenizer, not the reference's";
  EXPECT_TRUE(ref.lora.adapter_path.empty());
  for (const auto* refused : {&other_vocab, &no_model, &recompute, &simpo}) {
    ASSERT_FALSE(refused->empty());
    bool named = false;
    for (const auto& p : *refused) named = named || p.key == "preference.ref_model";
    EXPECT_TRUE(named) << refused->front().str();
  }
  ASSERT_EQ(other_vocab.size(), 1u);
  EXPECT_NE(other_vocab[0].reason.find("563"), std::string::npos) << other_vocab[0].str();
}

// [preference] as TRL's DPOConfig reads it: loss_type one name or a list (the resolved TOML writes
// the list and reloads to it); DPO of a full fine-tune scores its reference once unless the
// config says otherwise — TRL's frozen copy gives the same log-probabilities; CPO's cpo_alpha
// defaults to CPOConfig's 1, SimPO's to 0.
TEST(Config, PreferenceKeysResolveAsTrlReadsThem) {
  test::TempDir dir;
  const auto cwd = fs::current_path();
  fs::current_path(test::source_dir());
  const std::string cfg = "configs/tiny_dpo_qlora.toml";  // QLoRA DPO, loss_type = "sigmoid"
  const Config lora = load_config(cfg, {"preference.loss_type=\"hinge\""}, Environment{});
  const Config full = load_config(cfg, {"lora.enabled=false", "quant.base=\"none\""}, Environment{});
  const Config rpo = load_config(
      cfg, {"preference.loss_type=[\"sigmoid\", \"sft\"]", "preference.loss_weights=[1.0, 0.5]"}, Environment{});
  const Config cpo = load_config(cfg, {"training.objective=\"cpo\""}, Environment{});
  const Config cpo_half = load_config(cfg, {"training.objective=\"cpo\"", "preference.cpo_alpha=0.5"}, Environment{});
  const Config simpo = load_config(cfg, {"training.objective=\"simpo\""}, Environment{});
  std::vector<ConfigProblem> refused;
  try {
    load_config(cfg, {"lora.enabled=false", "quant.base=\"none\"", "preference.precompute_ref_log_probs=false"},
                Environment{});
  } catch (const ConfigError& e) {
    refused = e.problems;
  }
  fs::current_path(cwd);
  EXPECT_EQ(lora.preference.loss_type, std::vector<PreferenceLoss>{PreferenceLoss::hinge});
  EXPECT_FALSE(lora.preference.precompute_ref_log_probs);  // LoRA: the base with the adapters off
  EXPECT_TRUE(full.preference.precompute_ref_log_probs);
  EXPECT_EQ(rpo.preference.loss_type, (std::vector<PreferenceLoss>{PreferenceLoss::sigmoid, PreferenceLoss::sft}));
  EXPECT_EQ(rpo.preference.loss_weights, (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(cpo.preference.cpo_alpha, 1.0);  // CPOConfig's default
  EXPECT_EQ(cpo_half.preference.cpo_alpha, 0.5);
  EXPECT_EQ(simpo.preference.cpo_alpha, 0.0);  // SimPO: CPOTrainer without the NLL
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].key, "preference.precompute_ref_log_probs") << refused[0].str();
  for (const Config* c : {&lora, &full, &rpo, &cpo, &cpo_half}) {
    test::write_text(dir / "resolved.toml", to_toml(*c));
    fs::current_path(test::source_dir());
    const Config again = load_config(dir / "resolved.toml", {}, Environment{});
    fs::current_path(cwd);
    EXPECT_EQ(to_toml(again), to_toml(*c));
    EXPECT_EQ(again.preference.loss_type, c->preference.loss_type);
  }
}

// docs/config.md is what the key table renders (each key's default and meaning live beside
// its definition), and it documents every key.
TEST(Config, DocsAreGeneratedFromTheKeyTable) {
  std::ifstream in(test::source_dir() + "/docs/config.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  const std::string generated = config_reference();
  for (const auto& key : known_keys())
    EXPECT_NE(generated.find("| `" + key + "` |"), std::string::npos) << key << " undocumented";
  EXPECT_EQ(doc, generated)
      << "docs/config.md differs from the key table; regenerate it: build/ptrain --config-reference > docs/config.md";
}

// The other side of the validation matrix: the combinations the precision rules allow load
// without a problem.
TEST(Config, ValidPrecisionCombinationsPass) {
  test::TempDir dir;
  const std::string cfg = test::small_config(dir);
  const std::vector<std::vector<std::string>> valid{
      {"precision.mode=fp32", "precision.param_dtype=float32", "precision.reduce_dtype=float32"},
      {"precision.mode=mixed", "precision.param_dtype=bfloat16", "precision.reduce_dtype=bfloat16"},
      {"precision.mode=mixed", "precision.logits_dtype=bfloat16", "precision.allow_bf16_logits=true"},
      {"precision.mode=bf16", "precision.stochastic_rounding=true", "precision.reduce_dtype=float32"},
      {"precision.mode=bf16", "precision.logits_dtype=bfloat16", "precision.allow_bf16_logits=true"},
      {"precision.mode=bf16", "optimizer.name=adamw8bit", "precision.stochastic_rounding=true"},
      {"precision.mode=mixed", "optimizer.name=adamw8bit"},
      {"optimizer.in_backward=true", "training.max_grad_norm=0", "training.grad_accum_steps=1"},
  };
  for (const auto& sets : valid) {
    try {
      load_config(cfg, sets, Environment{});
    } catch (const ConfigError& e) {
      ADD_FAILURE() << sets[0] << " ...: " << e.what();
    }
  }
}
