// Filling a sharded model's units (parallel/fsdp.h) with weights: the seeded init (the same
// numbers at every world size and device), the load by tensor name (each rank copies only its
// slice of each tensor), NF4 quantization of the base, LoRA adapters. The units and their
// slots come from the model's plan (model/plan.h); FsdpModel itself only shards them.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "quant/nf4.h"

namespace ptrain {

class FsdpModel;

// A model's tensors by Hugging Face name ("model.layers.0.self_attn.q_proj.weight"), any
// dtype and shape as stored; e.g. HfCheckpoint::by_name(), views of memory-mapped files.
using TensorByName = std::function<at::Tensor(const std::string& name)>;
// A projection already quantized to NF4 (a bitsandbytes checkpoint), by the HF name of its
// weight and the shape the model gives it; its tensors may be views of a mapped file.
using Nf4ByName = std::function<nf4::Quantized(const std::string& name, const std::vector<int64_t>& shape)>;

// Seeded per unit (unit i draws from a generator seeded by (seed, i)) on the CPU, one unit at a
// time, each rank keeping its slice: the same weights for every device and world size. An NF4
// base draws the dense block and quantizes its projections. Then init_adapters(seed).
void init_weights(FsdpModel& model, uint64_t seed);
// LoRA: A Kaiming-uniform, B zeros (seeded per adapter unit), so the model starts as its base.
void init_adapters(FsdpModel& model, uint64_t seed);
// Copies this rank's slice of every parameter from `tensor` (of a memory-mapped checkpoint,
// only those bytes are read); an NF4 base quantizes one projection at a time — or, given
// `quantized` (a pre-quantized checkpoint), takes each projection's codes and statistics as
// stored, bit for bit. A tensor of another shape than the plan's is refused by name.
void load_weights(FsdpModel& model, const TensorByName& tensor, const Nf4ByName& quantized = {});
// LoRA: copies this rank's slice of every adapter tensor, by slot name ("model.layers.0.
// self_attn.q_proj.lora_A.weight"); every adapter slot must be present with its shape, and no
// other tensor may be.
void load_adapters(FsdpModel& model, const std::map<std::string, at::Tensor>& tensors);

}  // namespace ptrain
