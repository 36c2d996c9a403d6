// Decoding with a KV cache (model/llama.h KvCache, FsdpModel::next_logits, train/decode.h):
// the cached path gives the logits of recomputing the whole sequence at every step, for every
// family (Mistral past its sliding window too), with LoRA, after prompts fed in one piece or
// several; and the sampler's rules. Equality with transformers' generate is tests/sweep's
// generate_parity.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "config/config.h"
#include "model/llama.h"
#include "parallel/fsdp.h"
#include "test_util.h"
#include "train/decode.h"
#include "train/setup.h"
#include "train_util.h"

using namespace ptrain;

namespace {

std::unique_ptr<FsdpModel> model_of(const test::TempDir& dir, const std::string& fixture,
                                    const std::string& extra = "") {
  test::write_text(dir / "corpus.txt", test::synthetic_corpus(4000));
  test::write_text(dir / "g.toml", "[model]\nhf_path = \"" + test::fixture(fixture) + "\"\n[data]\npath = \"" +
                                       (dir / "corpus.txt") + "\"\nseq_len = 16\n[training]\ndevice = \"cpu\"\n" +
                                       extra);
  return build_model(test::load(dir / "g.toml"), at::kCPU, test::local_comm());
}

at::Tensor ids(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).view({1, -1}); }

// Decodes `steps` greedy tokens after `prompt` with a cache (the prompt fed in `pieces` parts)
// and returns the largest difference between a step's cached logits and the last row of the
// logits of the whole sequence recomputed without a cache.
double worst_cached_vs_recomputed(FsdpModel& m, std::vector<int64_t> prompt, int64_t steps, int pieces) {
  KvCache cache(m.shape(), 1, static_cast<int64_t>(prompt.size()) + steps, at::kFloat, at::kCPU);
  at::Tensor next;
  const auto n = static_cast<int64_t>(prompt.size());
  for (int p = 0; p < pieces; ++p) {
    const int64_t from = n * p / pieces, to = n * (p + 1) / pieces;
    next = m.next_logits(ids({prompt.begin() + from, prompt.begin() + to}), cache);
  }
  EXPECT_EQ(cache.length, n);
  double worst = 0;
  std::vector<int64_t> seq = prompt;
  for (int64_t s = 0; s < steps; ++s) {
    const at::Tensor full = m.logits(ids(seq)).select(0, static_cast<int64_t>(seq.size()) - 1);
    worst = std::max(worst, (next[0] - full).abs().max().item<double>() / full.abs().max().item<double>());
    seq.push_back(next[0].argmax().item<int64_t>());
    next = m.next_logits(ids({seq.back()}), cache);
  }
  return worst;
}

}  // namespace

TEST(Generate, TheKvCacheGivesTheLogitsOfRecomputingTheWholeSequence) {
  test::TempDir dir;
  // hf_mistral's sliding window is 32 positions: 9 + 40 runs past it.
  for (const std::string family : {"hf_odd", "hf_llama_bias", "hf_tiny", "hf_qwen2", "hf_qwen3", "hf_mistral"}) {
    auto m = model_of(dir, family);
    const std::vector<int64_t> prompt{3, 141, 59, 26, 5, 35, 89, 79, 32};
    for (int pieces : {1, 3}) {
      const double worst = worst_cached_vs_recomputed(*m, prompt, 40, pieces);
      EXPECT_LT(worst, 1e-5) << family << ", the prompt in " << pieces << " piece(s)";
    }
  }
  // LoRA adapters (PEFT's, on hf_tiny) go through the same blocks.
  auto lora = model_of(dir, "hf_tiny",
                       "[lora]\nenabled = true\nrank = 4\nalpha = 8.0\ntargets = [\"q\", \"v\", \"down\"]\n"
                       "adapter_path = \"" +
                           test::fixture("peft_tiny") + "\"\n");
  EXPECT_LT(worst_cached_vs_recomputed(*lora, {7, 7, 200, 13}, 30, 2), 1e-5);
  // QLoRA: the base stays NF4 (its 4-bit linear) under the adapters.
  auto qlora = model_of(dir, "hf_tiny",
                        "[quant]\nbase = \"nf4\"\n[lora]\nenabled = true\nrank = 4\nalpha = 8.0\n"
                        "targets = [\"q\", \"v\", \"down\"]\nadapter_path = \"" +
                            test::fixture("peft_tiny") + "\"\n");
  EXPECT_GT(qlora->nf4_bytes(), 0);
  EXPECT_LT(worst_cached_vs_recomputed(*qlora, {7, 7, 200, 13}, 30, 2), 1e-5);
}

// complete(): greedy is the argmax chain; top_k = 1 and a tiny top_p leave only the most likely
// token, so they sample the greedy chain whatever the seed; a seed repeats its draws; the model's
// positions bound the answer and a prompt that fills them is refused.
TEST(Generate, SamplingFollowsItsSeedTopKAndTopP) {
  test::TempDir dir;
  auto m = model_of(dir, "hf_qwen3");
  const std::vector<int32_t> prompt{11, 22, 33, 44, 55};
  SamplingOptions greedy;
  greedy.max_new_tokens = 20;
  const Completion g = complete(*m, prompt, {}, greedy, nullptr);
  EXPECT_EQ(g.finish, "length");
  ASSERT_EQ(g.ids.size(), 20u);
  EXPECT_EQ(g.prompt_tokens, 5);
  EXPECT_EQ(g.cache_bytes, 2 * m->shape().n_layers * m->shape().n_kv_heads * m->shape().head_dim * 25 * 4);
  SamplingOptions o = greedy;
  o.temperature = 1.3;
  for (uint64_t seed : {1, 2, 3}) {
    o.seed = seed;
    o.top_k = 1;
    o.top_p = 1.0;
    EXPECT_EQ(complete(*m, prompt, {}, o, nullptr).ids, g.ids) << "top_k = 1, seed " << seed;
    o.top_k = 0;
    o.top_p = 1e-9;
    EXPECT_EQ(complete(*m, prompt, {}, o, nullptr).ids, g.ids) << "top_p ~ 0, seed " << seed;
  }
  o.top_p = 1.0;
  o.seed = 5;
  const Completion a = complete(*m, prompt, {}, o, nullptr), b = complete(*m, prompt, {}, o, nullptr);
  EXPECT_EQ(a.ids, b.ids);
  o.seed = 6;
  EXPECT_NE(complete(*m, prompt, {}, o, nullptr).ids, a.ids);  // (20 draws at temperature 1.3)
  // An end-of-sequence id stops the answer, and is its last id.
  size_t first_new = 1;  // the first id of the chain not seen before it
  while (first_new < g.ids.size() &&
         std::find(g.ids.begin(), g.ids.begin() + first_new, g.ids[first_new]) != g.ids.begin() + first_new)
    ++first_new;
  ASSERT_LT(first_new, g.ids.size()) << "the greedy chain repeats one id: pick another prompt";
  const Completion stopped = complete(*m, prompt, {g.ids[first_new]}, greedy, nullptr);
  EXPECT_EQ(stopped.finish, "eos");
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(g.ids.begin(), g.ids.begin() + first_new + 1));
  // The model's positions (hf_qwen3: max_seq_len) bound the cache.
  const int64_t positions = m->shape().max_seq_len;
  SamplingOptions lots = greedy;
  lots.max_new_tokens = positions * 2;
  const Completion full = complete(*m, prompt, {}, lots, nullptr);
  EXPECT_EQ(static_cast<int64_t>(full.ids.size()), positions - 5);
  EXPECT_EQ(full.finish, "length");
  EXPECT_THROW(complete(*m, std::vector<int32_t>(static_cast<size_t>(positions), 1), {}, greedy, nullptr), UsageError);
}
