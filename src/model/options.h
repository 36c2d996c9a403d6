// The model part's options, as the config's [lora], [quant] and [kernels] sections hold them: each field's
// initialiser is the key's default (docs/config.md shows them), in this one place. Validation:
// problems() beside each struct (its section's own rules); config/validate.cpp holds the rules
// that read several sections or files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"

namespace ptrain {

// [lora]: trainable low-rank adapters over a frozen base.
struct LoraOptions {
  bool enabled = false;
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  bool rslora = false;                         // scale alpha / sqrt(rank) instead of alpha / rank (PEFT use_rslora)
  std::vector<std::string> targets{"q", "v"};  // lora_targets() names (model/layout.h)
  std::string adapter_path;                    // "" | a PEFT adapter directory to start from
  OptionProblems problems() const;             // rank, alpha, dropout
};

// model.gguf_reader: which of a GGUF file's two readers decides the network it holds (both read
// its tensors alike): transformers' GGUF loader, which drops RoPE scaling and Llama attention
// biases (ptrain refuses files that have them), or llama.cpp, which computes with them.
enum class GgufReader { transformers, llama_cpp };  // "transformers", "llama.cpp"

// [quant]: how the frozen base is stored.
enum class QuantBase { none, nf4 };
struct QuantOptions {
  QuantBase base = QuantBase::none;  // nf4: every block's seven projections in NF4 (needs LoRA)
  bool double_quant = true;          // NF4 absmax scales quantized too
  bool nf4() const { return base == QuantBase::nf4; }
};

// [kernels]: fused implementations of the decoder's pieces, each switchable so a GPU run can race
// it against the composite LibTorch path (docs/kernels.md). On by default since the H200 race
// (1.20x tokens/s all on, Llama 3.2 1B mixed); off: the composite path.
struct KernelOptions {
  bool fused_swiglu = true;     // model/swiglu.h: silu(gate) * up in one pass each way, silu not kept
  bool fused_grad_norm = true;  // parallel/grad_norm.h: squares summed in float64 without a float64 copy
  bool fused_rope = true;       // model/rope.h: q and k rotated in one pass each way
  bool fused_loss = true;       // model/loss.h: each logits chunk's softmax, loss and gradient in one kernel
};

}  // namespace ptrain
