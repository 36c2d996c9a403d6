// The activation part of the memory planner against the bytes LibTorch actually allocates:
// what a forward pass leaves alive for backward (AllocationMeter around forward_loss), for
// several shapes with and without activation checkpointing, and with activation offloading
// through the trainer.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/alloc_meter.h"
#include "config/config.h"
#include "model/shape.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"
#include "test_util.h"
#include "train/memory.h"
#include "train/setup.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ptrain;

namespace {
LlamaShape shape(int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t ffn, int64_t vocab,
                 bool tied = false) {
  LlamaShape s = preset_shape("tiny").value();
  s.dim = dim, s.n_layers = layers, s.n_heads = heads, s.n_kv_heads = kv, s.head_dim = dim / heads, s.ffn_dim = ffn;
  if (dim == 72) s.head_dim = 24;  // q_dim 96 != dim
  s.vocab_size = vocab, s.tie_embeddings = tied;
  return s;
}

LlamaShape family(LlamaShape s, Family f, bool biases = false) {
  s.family = f;
  s.attention_bias = s.mlp_bias = biases;
  return s;
}
}  // namespace

TEST(Memory, SavedActivationsMatchPrediction) {
  const std::vector<std::pair<std::string, LlamaShape>> shapes{
      {"dim64", shape(64, 2, 4, 2, 160, 256)},
      {"odd96", shape(96, 3, 6, 2, 211, 300)},
      {"mha_tied", shape(80, 1, 5, 5, 130, 77, true)},
      {"wide", shape(256, 2, 8, 1, 688, 1000)},
      {"head_dim24", shape(72, 2, 4, 2, 190, 131)},
      {"llama_bias", family(shape(72, 2, 4, 2, 190, 131), Family::llama, true)},
      {"qwen2", family(shape(84, 2, 6, 2, 150, 311, true), Family::qwen2)},
      {"qwen3", family(shape(72, 2, 4, 2, 130, 257), Family::qwen3)},
      {"mistral", family(shape(96, 2, 6, 3, 200, 333), Family::mistral)}};
  for (const auto& [name, s] : shapes) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool checkpointing = variant == 1, fused_swiglu = variant == 2;
      SCOPED_TRACE(name + (checkpointing ? " checkpointing" : "") + (fused_swiglu ? " fused SwiGLU" : ""));
      FsdpOptions o;
      o.memory.activation_checkpointing = checkpointing ? Checkpointing::full : Checkpointing::none;
      o.kernels.fused_swiglu = fused_swiglu;
      FsdpModel model(test::plan(s), PrecisionPolicy{}, at::kCPU, test::local_comm(), o);
      init_weights(model, 1);
      const int64_t B = 3, T = 40;
      at::Tensor tokens = at::randint(0, s.vocab_size, {B, T + 1}, at::kLong);
      at::Tensor in = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);
      model.forward_loss(in, tgt, 50).backward();  // first call builds the RoPE tables
      model.zero_grad();
      int64_t measured = 0;
      at::Tensor loss;
      {
        MeterScope scope;
        loss = model.forward_loss(in, tgt, 50);
        measured = scope.meter().net.load();
      }
      ActivationInputs a;
      a.tokens = B * T;
      a.checkpointing = checkpointing;
      a.fused_swiglu = fused_swiglu;
      a.fused_norm = false;  // the CPU's composite RMSNorm
      const int64_t predicted = predict_activations(s, a).saved_bytes();
      std::cout << name << (checkpointing ? " full" : " none") << ": measured " << measured << " B, predicted "
                << predicted << " B (" << 100.0 * (static_cast<double>(predicted) / static_cast<double>(measured) - 1)
                << " %)\n";
      EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(measured), 0.01 * static_cast<double>(measured));
      loss.backward();
    }
  }
}

// Qwen3's per-head q/k RMSNorm under LoRA keeps its adapted q and k (tensors of their own
// rather than views of the fused q/k/v output) and a float32 rstd per head, as the planner counts
// (full fine-tuning: Memory.SavedActivationsMatchPrediction).
TEST(Memory, QkNormActivationsUnderLoraMatchPrediction) {
  const LlamaShape s = family(shape(72, 2, 4, 2, 130, 257), Family::qwen3);
  for (const auto& targets :
       {std::vector<std::string>{"q", "k", "v", "o", "gate", "up", "down"}, std::vector<std::string>{"q", "k"}}) {
    const std::string what = "lora targets " + std::to_string(targets.size());
    SCOPED_TRACE(what);
    PrecisionPolicy policy;
    LoraOptions lora;
    lora.enabled = !targets.empty();
    lora.targets = targets;
    lora.rank = 4;
    FsdpModel model(test::plan(s, policy, lora), policy, at::kCPU, test::local_comm());
    init_weights(model, 1);
    const int64_t B = 3, T = 40;
    at::Tensor tokens = at::randint(0, s.vocab_size, {B, T + 1}, at::kLong);
    at::Tensor in = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);
    model.forward_loss(in, tgt, 50).backward();  // the RoPE tables
    model.zero_grad();
    int64_t measured = 0;
    {
      MeterScope scope;
      at::Tensor loss = model.forward_loss(in, tgt, 50);
      measured = scope.meter().net.load() - static_cast<int64_t>(loss.nbytes());
      loss.backward();
      model.finish_backward();
    }
    ActivationInputs a;
    a.tokens = B * T;
    a.fused_norm = false;
    a.lora = lora.enabled;
    a.lora_rank = 4;
    const auto projections = block_projections(s);
    for (size_t i = 0; i < projections.size(); ++i)
      a.adapted[i] = std::find(targets.begin(), targets.end(), projections[i].target) != targets.end();
    const int64_t predicted = predict_activations(s, a).saved_bytes();
    std::cout << what << ": measured " << measured << " B, predicted " << predicted << " B\n";
    EXPECT_EQ(predicted, measured);
  }
}

// Packed rows keep one attention mask, the positions and the per-token RoPE cos/sin for all
// blocks, on top of what the same unpacked batch keeps: as the planner counts them.
TEST(Memory, PackedRowsKeepOneMaskAsPredicted) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const LlamaShape s = shape(96, 3, 6, 2, 211, 300);
    PrecisionPolicy policy;
    if (bf16) policy.compute_dtype = at::kBFloat16;
    FsdpModel model(test::plan(s, policy), policy, at::kCPU, test::local_comm());
    init_weights(model, 1);
    const int64_t B = 3, T = 40;
    at::Tensor tokens = at::randint(0, s.vocab_size, {B, T + 1}, at::kLong);
    at::Tensor in = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);
    at::Tensor docs = at::arange(T, at::kLong).div(7, "floor").expand({B, T}).contiguous();  // documents of 7 tokens
    model.forward_loss(in, tgt, 50).backward();                                              // the RoPE tables
    model.zero_grad();
    auto saved = [&](const at::Tensor& doc_ids) {
      MeterScope scope;
      at::Tensor loss = model.forward_loss(in, tgt, 50, doc_ids);
      const int64_t net = scope.meter().net.load();
      loss.backward();
      model.zero_grad();
      return net;
    };
    const int64_t plain = saved(at::Tensor());
    const int64_t packed = saved(docs);
    ActivationInputs a;
    a.tokens = B * T;
    a.compute_bytes = bf16 ? 2 : 4;
    a.packed_rows = B, a.packed_len = T;
    const int64_t predicted = predict_activations(s, a).mask_bytes;
    std::cout << "packed rows: " << packed - plain << " B more than unpacked, predicted " << predicted << " B\n";
    EXPECT_EQ(packed - plain, predicted);
  }
}

// Rows longer than Mistral's sliding window keep one additive mask [1, 1, T, T] for all blocks, on
// top of what the same rows keep without a window: as the planner counts it.
TEST(Memory, RowsPastTheSlidingWindowKeepOneMaskAsPredicted) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    const LlamaShape plain_shape = family(shape(96, 3, 6, 2, 211, 300), Family::mistral);
    LlamaShape windowed_shape = plain_shape;
    windowed_shape.sliding_window = 7;
    PrecisionPolicy policy;
    if (bf16) policy.compute_dtype = at::kBFloat16;
    const int64_t B = 3, T = 40;
    at::Tensor tokens = at::randint(0, plain_shape.vocab_size, {B, T + 1}, at::kLong);
    at::Tensor in = tokens.narrow(1, 0, T), tgt = tokens.narrow(1, 1, T);
    auto saved = [&](const LlamaShape& s) {
      FsdpModel model(test::plan(s, policy), policy, at::kCPU, test::local_comm());
      init_weights(model, 1);
      model.forward_loss(in, tgt, 50).backward();  // the RoPE tables
      model.zero_grad();
      MeterScope scope;
      at::Tensor loss = model.forward_loss(in, tgt, 50);
      const int64_t net = scope.meter().net.load();
      loss.backward();
      return net;
    };
    const int64_t plain = saved(plain_shape);
    const int64_t windowed = saved(windowed_shape);
    ActivationInputs a;
    a.tokens = B * T;
    a.compute_bytes = bf16 ? 2 : 4;
    a.windowed_len = T;
    const int64_t predicted = predict_activations(windowed_shape, a).mask_bytes;
    std::cout << "rows past the window: " << windowed - plain << " B more than without one, predicted " << predicted
              << " B\n";
    EXPECT_EQ(windowed - plain, predicted);
    EXPECT_GT(predicted, 0);
  }
}

// Activation offloading (memory.activation_offloading) for a full fine-tune and for QLoRA: the
// same losses bit for bit as checkpointing alone (the recompute reads the same values, brought
// back from the host); forward leaves on the device only what the planner says (the head's
// tensors: every block input is in the offloader's host copies, as many bytes as it predicts),
// and backward hands every host copy back.
TEST(Memory, ActivationOffloadingTrainsIdenticallyAndKeepsInputsOnTheHost) {
  const std::vector<std::string> qlora{"lora.enabled=true",
                                       "lora.targets=[\"q\",\"k\",\"v\",\"o\",\"gate\",\"up\",\"down\"]", "lora.rank=4",
                                       "optimizer.lr=1e-2", "quant.base=\"nf4\""};
  for (const auto& extra : {std::vector<std::string>{}, qlora}) {
    SCOPED_TRACE(extra.empty() ? "full fine-tune" : "QLoRA");
    test::TempDir dir;
    const std::string cfg = test::small_config(dir);
    std::map<bool, std::map<int64_t, double>> curve;
    std::map<bool, int64_t> on_device;
    for (bool offload : {false, true}) {
      std::vector<std::string> sets = extra;
      sets.insert(sets.end(),
                  {"memory.activation_checkpointing=\"full\"", "training.steps=6", "checkpoint.save_final=false",
                   "memory.activation_offloading=" + std::string(offload ? "true" : "false"),
                   "run.output_dir=" + (dir / (offload ? "offload" : "ac"))});
      const Config c = test::load(cfg, sets);
      ASSERT_EQ(train(c), 0);
      curve[offload] = test::losses(dir / ((offload ? "offload" : "ac") + std::string("/metrics.jsonl")));
      {  // the run reports the host bytes its offloaded inputs took: one micro-batch's block inputs
        std::ifstream in(dir / ((offload ? "offload" : "ac") + std::string("/metrics.jsonl")));
        std::string line;
        std::getline(in, line);
        EXPECT_EQ(
            nlohmann::json::parse(line)["offload_host_peak_bytes"].get<int64_t>(),
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
    const Config c = test::load(cfg, extra);  // the block inputs [micro-batch, seq_len, dim] in float32, one per block
    const int64_t inputs = c.model.shape.n_layers * c.data.micro_batch_size * c.data.seq_len * c.model.shape.dim * 4;
    EXPECT_EQ(on_device[false] - on_device[true], inputs);
    std::cout << (extra.empty() ? "full fine-tune" : "QLoRA") << ": saved on the device after forward "
              << on_device[false] << " B with checkpointing, " << on_device[true] << " B with offloading\n";
  }
}
