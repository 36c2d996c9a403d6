// Step-parity harness, run under mpirun at any world size by Dist.StepParity*: loads an HF
// model of tests/fixtures/make_step_fixtures.py (any family) into FSDP units (float32), then
//   1. one forward/backward on step 0's global batch (each rank its rows): writes every
//      parameter's gradient, all-gathered from the shards and named as HF names it;
//   2. ten train_step()s — the trainer's step — with the fixture's lr, AdamW and clipping:
//      writes each step's loss (mean over ranks).
// Usage: step_parity EXPECTED.safetensors HF_DIR OUT.safetensors [--checkpointing] [--qlora ADAPTER_DIR].
// Rank 0 writes OUT; the comparison with the reference is the test's. --checkpointing recomputes
// each block in backward (memory.activation_checkpointing = "full"). --qlora trains the PEFT
// adapter in ADAPTER_DIR over the model quantized to NF4 (quant.base = "nf4", double-quantized
// statistics), as tests/fixtures/make_qlora_fixtures.py does: the gradients are the adapters'.
#include <ATen/ATen.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"
#include "train/setup.h"
#include "train/step.h"

using namespace ptrain;

int main(int argc, char** argv) {
  bool checkpointing = false, usage_error = argc < 4;
  std::string qlora_adapter;
  for (int i = 4; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--checkpointing")
      checkpointing = true;
    else if (arg == "--qlora" && i + 1 < argc)
      qlora_adapter = argv[++i];
    else
      usage_error = true;
  }
  if (usage_error) {
    std::cerr << "usage: step_parity EXPECTED.safetensors HF_DIR OUT.safetensors [--checkpointing] "
                 "[--qlora ADAPTER_DIR]\n";
    return 2;
  }
  try {
    SafetensorsFile expected(argv[1]);
    const auto& meta = expected.metadata();
    const at::Tensor tokens = expected.tensor("tokens").clone();  // [steps, global batch, T+1]
    const at::Tensor lrs = expected.tensor("lrs").clone();
    std::shared_ptr<Collectives> comm =
        make_collectives(DistEnv::detect(), Backend::automatic, c10::Device(c10::kCPU), 120.0);
    const int64_t ws = comm->world_size(), rank = comm->rank();
    const int64_t rows = tokens.size(1) / ws;
    if (rows * ws != tokens.size(1)) throw std::runtime_error("the global batch does not divide by the world size");
    auto my_rows = [&](int64_t step) { return tokens[step].narrow(0, rank * rows, rows); };

    FsdpOptions fsdp;
    fsdp.memory.activation_checkpointing = checkpointing ? Checkpointing::full : Checkpointing::none;
    const LlamaShape shape = read_hf_config(argv[2]);
    PeftAdapter adapter;
    PlanOptions plan;
    plan.init_std = 0.02;
    if (!qlora_adapter.empty()) {
      adapter = read_peft(qlora_adapter, shape);
      plan.lora.enabled = true;
      plan.quant = {QuantBase::nf4, true};
      plan.lora.targets = adapter.targets;
      plan.lora.rank = adapter.rank;
      plan.lora.alpha = adapter.alpha;
      plan.lora.rslora = adapter.rslora;
    }
    const HfCheckpoint hf(argv[2]);
    verify_hf_tensors(hf, shape, HfStorage{}, true);
    FsdpModel model(ModelPlan::make(shape, plan), PrecisionPolicy{}, at::kCPU, comm, fsdp);
    load_weights(model, hf.by_name());
    if (plan.lora.enabled) load_adapters(model, adapter.tensors);
    const int64_t T = tokens.size(2) - 1;
    std::vector<std::pair<std::string, at::Tensor>> out;

    // 1. Gradients of step 0's loss.
    model.zero_grad();
    at::Tensor loss0 = model.forward_loss(my_rows(0).narrow(1, 0, T), my_rows(0).narrow(1, 1, T), 37);
    loss0.backward();
    model.finish_backward();
    at::Tensor mean0 = loss0.detach().to(at::kDouble).reshape({1}) / static_cast<double>(ws);
    comm->all_reduce_sum(mean0);
    out.emplace_back("loss0", mean0);
    for (auto& u : model.trained_units()) {
      if (u.layout.slots.empty()) continue;  // LoRA: the embedding's and the head's adapter units are empty
      at::Tensor full = at::empty({u.shard_numel * ws}, at::kFloat);
      comm->all_gather(full, u.shard.grad());
      for (const auto& slot : u.layout.slots) out.emplace_back("grad." + slot.name, slot_view(full, slot).clone());
    }

    // 2. Ten steps of the trainer's step function.
    double b1 = 0, b2 = 0;
    if (std::sscanf(meta.at("betas").c_str(), "%lf,%lf", &b1, &b2) != 2) throw std::runtime_error("bad betas metadata");
    AdamW optim(optim_targets(model),
                AdamWOptions{b1, b2, std::stod(meta.at("eps")), std::stod(meta.at("weight_decay")), false, 0});
    const StepOptions options{1, std::stod(meta.at("max_grad_norm")), 37};
    at::Tensor losses = at::zeros({tokens.size(0)}, at::kDouble);
    for (int64_t step = 0; step < tokens.size(0); ++step) {
      const StepResult r = train_step(
          model, optim, [&](int64_t) { return Batch::of_windows(my_rows(step)); }, lrs[step].item<double>(), options);
      losses[step] = r.loss / static_cast<double>(ws);
    }
    comm->all_reduce_sum(losses);
    out.emplace_back("losses", losses);
    if (rank == 0) write_safetensors(argv[3], out, {{"world_size", std::to_string(ws)}});
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "step_parity: " << e.what() << "\n";
    return 1;
  }
}
