// The activation part of the memory planner against the bytes LibTorch actually allocates:
// what a forward pass leaves alive for backward (AllocationMeter around forward_loss), for
// several shapes with and without activation checkpointing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/alloc_meter.h"
#include "model/shape.h"
#include "parallel/fsdp.h"
#include "train/memory.h"
#include "test_util.h"

using namespace ptrain;

namespace {
LlamaShape shape(int64_t dim, int64_t layers, int64_t heads, int64_t kv, int64_t ffn, int64_t vocab, bool tied = false) {
  LlamaShape s = preset_shape("tiny").value();
  s.dim = dim, s.n_layers = layers, s.n_heads = heads, s.n_kv_heads = kv, s.head_dim = dim / heads, s.ffn_dim = ffn;
  if (dim == 72) s.head_dim = 24;  // q_dim 96 != dim
  s.vocab_size = vocab, s.tie_embeddings = tied;
  return s;
}
}  // namespace

TEST(Memory, SavedActivationsMatchPrediction) {
  const std::vector<std::pair<std::string, LlamaShape>> shapes{{"dim64", shape(64, 2, 4, 2, 160, 256)},
                                                               {"odd96", shape(96, 3, 6, 2, 211, 300)},
                                                               {"mha_tied", shape(80, 1, 5, 5, 130, 77, true)},
                                                               {"wide", shape(256, 2, 8, 1, 688, 1000)},
                                                               {"head_dim24", shape(72, 2, 4, 2, 190, 131)}};
  for (const auto& [name, s] : shapes) {
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(name + (checkpointing ? " checkpointing" : ""));
      FsdpOptions o;
      o.activation_checkpointing = checkpointing;
      FsdpModel model(s, PrecisionPolicy{}, at::kCPU, 0.02, test::local_comm(), o);
      model.init_weights(1);
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
      a.fused_norm = false;  // the CPU's composite RMSNorm
      const int64_t predicted = predict_activations(s, a).saved_bytes();
      std::cout << name << (checkpointing ? " full" : " none") << ": measured " << measured << " B, predicted " << predicted
                << " B (" << 100.0 * (static_cast<double>(predicted) / static_cast<double>(measured) - 1) << " %)\n";
      EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(measured), 0.01 * static_cast<double>(measured));
      loss.backward();
    }
  }
}
