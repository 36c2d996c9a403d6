// Helpers shared by the unit tests: fixture paths, temporary directories, a synthetic
// corpus and small model configs.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/fs_util.h"
#include "config/config.h"
#include "model/plan.h"
#include "model/shape.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/precision.h"

namespace ptrain::test {

// Paths of this build (tests/CMakeLists.txt generates them): the checkout, ptrain, and the
// step-parity harness.
extern const char* const kSourceDirFallback;
extern const char* const kBinPath;
extern const char* const kStepParityPath;

inline std::string source_dir() {
  const char* s = std::getenv("PTRAIN_SOURCE_DIR");
  return s ? s : kSourceDirFallback;
}
inline std::string fixture(const std::string& name) { return source_dir() + "/tests/fixtures/" + name; }

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ptrain_test_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() { remove_tree(path.string()); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// Collectives of a single process (world size 1, no launcher).
inline std::shared_ptr<Collectives> local_comm() {
  return make_collectives(DistEnv{}, Backend::automatic, c10::Device(c10::kCPU), 60.0);
}

// The plan of a model of `shape` (init std 0.02) in `policy`'s dtypes, with LoRA / an NF4 base
// where given.
inline ModelPlan plan(const LlamaShape& shape, const PrecisionPolicy& policy = {}, const LoraOptions& lora = {},
                      const QuantOptions& quant = {}) {
  return ModelPlan::make(shape, PlanOptions{0.02, policy.master_dtype, policy.compute_dtype, lora, quant});
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Seeded pseudo-English: sentences over a small vocabulary with fixed word order patterns,
// so a small model has structure to learn.
inline std::string synthetic_corpus(size_t bytes, uint32_t seed = 7) {
  static const std::vector<std::string> subjects{"the cat", "a dog", "my friend", "the old man", "our team", "she"};
  static const std::vector<std::string> verbs{"sees", "likes", "builds", "finds", "eats", "paints"};
  static const std::vector<std::string> objects{"a red apple", "the small house", "two green birds",
                                                "the river",   "a long story",    "bread"};
  std::mt19937 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    out += subjects[rng() % subjects.size()] + " " + verbs[rng() % verbs.size()] + " " +
           objects[rng() % objects.size()] + ".\n";
  }
  out.resize(bytes);
  return out;
}

// n seeded chats as JSONL ({"messages": ...} per line) of varied lengths: an optional system
// turn, one to three exchanges, replies of 1 to 12 words; trained tokens per sample vary.
inline std::string chat_jsonl(const std::string& path, int n, uint32_t seed = 3) {
  static const std::vector<std::string> words{"the",   "model", "trains",  "shards", "gradient", "memory", "rank",
                                              "token", "layer", "weights", "12",     "345",      "café",   "日本語"};
  std::mt19937 rng(seed);
  auto sentence = [&](int k) {
    std::string s;
    for (int i = 0; i < k; ++i) s += (i ? " " : "") + words[rng() % words.size()];
    return s;
  };
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += "{\"messages\": [";
    if (rng() % 2) out += "{\"role\": \"system\", \"content\": \"Answer briefly.\"}, ";
    const int turns = 1 + static_cast<int>(rng() % 3);
    for (int t = 0; t < turns; ++t)
      out += std::string(t ? ", " : "") + "{\"role\": \"user\", \"content\": \"" +
             sentence(1 + static_cast<int>(rng() % 6)) + "?\"}, {\"role\": \"assistant\", \"content\": \"" +
             sentence(1 + static_cast<int>(rng() % 12)) + ".\"}";
    out += "]}\n";
  }
  write_text(path, out);
  return path;
}

// The [model] section of the small test model: dim 64, 2 layers, GQA 4/2.
inline const std::string kSmallModel =
    "preset = \"tiny\"\ndim = 64\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nffn_dim = 160\n";
// The shape kSmallModel gives.
inline LlamaShape small_shape() {
  LlamaShape shape = preset_shape("tiny").value();
  shape.dim = 64, shape.n_layers = 2, shape.n_heads = 4, shape.n_kv_heads = 2, shape.head_dim = 16, shape.ffn_dim = 160;
  return shape;
}

// A small training config writing into dir (byte-level synthetic corpus, 20 steps); `model` is
// its [model] section, extra TOML lines are appended.
inline std::string small_config(const TempDir& dir, const std::string& extra = "", size_t corpus_bytes = 60000,
                                const std::string& model = kSmallModel) {
  const std::string corpus = dir / "corpus.txt";
  if (!std::filesystem::exists(corpus)) write_text(corpus, synthetic_corpus(corpus_bytes));
  const std::string path = dir / "config.toml";
  write_text(path, "[run]\nname = \"t\"\noutput_dir = \"" + (dir / "run") +
                       "\"\nseed = 5\n"
                       "[model]\n" +
                       model + "[data]\npath = \"" + corpus +
                       "\"\nseq_len = 32\nmicro_batch_size = 4\n"
                       "[training]\nsteps = 20\nlog_every = 1\neval_every = 0\ndevice = \"cpu\"\n"
                       "[optimizer]\nlr = 3e-3\n[lr_schedule]\nwarmup_steps = 5\n" +
                       extra);
  return path;
}

}  // namespace ptrain::test
