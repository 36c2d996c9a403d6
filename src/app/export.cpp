#include "app/export.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/log.h"
#include "config/config.h"
#include "model/layout.h"
#include "model/llama.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "quant/nf4.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "train/setup.h"

namespace ptrain {

namespace fs = std::filesystem;

void export_merged(const std::string& checkpoint_dir, const std::string& out_dir) {
  Environment env = Environment::detect();
  env.local = false;  // the training run's data files need not be here
  Config c = load_config((fs::path(checkpoint_dir) / "config.toml").string(), {}, env);
  if (!c.lora.enabled)
    throw UsageError("--merge needs a LoRA checkpoint; '" + checkpoint_dir + "' holds a full model (drop --merge)");
  c.training.device = DeviceChoice::cpu;
  c.checkpoint.resume.clear();
  // Read the frozen base at its source's full precision (a bf16 run keeps it in bf16); the
  // adapters convert exactly.
  c.precision.mode = PrecisionMode::fp32;
  auto model = build_model(c, c10::Device(c10::kCPU),
                           make_collectives(DistEnv{}, Backend::automatic, c10::Device(c10::kCPU), 60.0));
  TrainProgress progress;
  load_checkpoint(checkpoint_dir, *model, nullptr, progress);
  at::NoGradGuard no_grad;
  const LlamaShape& s = c.model.shape;
  const auto& full = model->plan().full;  // every base tensor, the blocks' matrices included
  const double scale = lora_scale(c.lora);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < full.size(); ++i) {
    const FlatUnit& u = model->unit({UnitRole::base, i});
    at::Tensor flat = at::zeros({full[i].numel}, at::kFloat);
    // The base: dense units copy over by slot; NF4 modules are dequantized into place.
    for (const auto& slot : u.layout.slots)
      flat.narrow(0, full[i].offset_of(slot.name), slot.numel).copy_(u.shard.narrow(0, slot.offset, slot.numel));
    if (c.quant.base == QuantBase::nf4 && full[i].kind == UnitKind::block) {
      int p = 0;
      for (const auto& group : block_matrix_groups(full[i]))
        for (const auto& module : group)
          slot_view(flat, module).copy_(nf4::dequantize(*model->nf4_weight(i, static_cast<Proj>(p++)), at::kFloat));
    }
    const FlatUnit& a = model->trained_units()[i];
    for (const auto& slot : a.layout.slots) {  // W += scale * B @ A, per adapted projection
      const auto lora_at = slot.name.find(".lora_A.weight");
      if (lora_at == std::string::npos) continue;
      const std::string stem = slot.name.substr(0, lora_at);
      const std::string b_name = stem + ".lora_B.weight";
      const auto& b_slot = *std::find_if(a.layout.slots.begin(), a.layout.slots.end(),
                                         [&](const ParamSlot& x) { return x.name == b_name; });
      at::Tensor A = slot_view(a.shard, slot).to(at::kFloat);
      at::Tensor B = slot_view(a.shard, b_slot).to(at::kFloat);
      const std::string w_name = stem + ".weight";
      const int64_t off = full[i].offset_of(w_name);
      flat.narrow(0, off, B.size(0) * A.size(1)).view({B.size(0), A.size(1)}).add_(at::mm(B, A), scale);
    }
    for (const auto& slot : full[i].slots) named.emplace_back(slot.name, slot_view(flat, slot));
  }
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), named, {{"format", "pt"}});
  write_hf_config(out_dir, s);
}

namespace {
// The tokenizer files of the run's model directory (model.hf_path), beside an exported model: a
// directory transformers loads whole. Nothing when the run started from the seeded init.
void copy_tokenizer(const std::string& checkpoint_dir, const std::string& out_dir) {
  Environment env = Environment::detect();
  env.local = false;  // the run's data files need not be here
  std::string source;
  try {
    source = load_config((fs::path(checkpoint_dir) / "config.toml").string(), {}, env).tokenizer_path();
  } catch (const std::exception& e) {  // the model directory is not here: the export itself is whole
    log::warn("not copying a tokenizer beside the export: the run's config does not load here (", e.what(), ")");
    return;
  }
  if (source.empty()) return;
  if (const std::string gguf = gguf_tokenizer_file(source); !gguf.empty()) {  // a GGUF base: as save_pretrained
    write_gguf_tokenizer_dir(read_gguf_tokenizer(gguf), out_dir);
    log::info("wrote the tokenizer of ", gguf, " beside it (tokenizer.json, tokenizer_config.json",
              fs::exists(fs::path(out_dir) / "chat_template.jinja") ? ", chat_template.jinja)" : ")");
    return;
  }
  if (!fs::is_directory(source)) return;
  // The tokenizer file transformers reads there (tokenizer.json, or the one fast_tokenizer_files
  // names): none in a model directory a run on token files started from, and nothing to copy.
  std::string versioned;
  try {
    const fs::path read = hf_tokenizer_file(source);
    if (!fs::is_regular_file(read)) return;
    versioned = read.lexically_relative(source).string();  // inside it (hf_tokenizer_file), perhaps in a folder
  } catch (const std::exception& e) {
    log::warn("not copying a tokenizer beside the export: ", e.what());
    return;
  }
  for (const std::string& f :
       {std::string("tokenizer.json"), versioned, std::string("tokenizer_config.json"),
        std::string("chat_template.jinja"), std::string("special_tokens_map.json"), std::string("added_tokens.json")})
    if (fs::is_regular_file(fs::path(source) / f)) {
      fs::create_directories((fs::path(out_dir) / f).parent_path());
      fs::copy_file(fs::path(source) / f, fs::path(out_dir) / f, fs::copy_options::overwrite_existing);
    }
  if (fs::is_directory(fs::path(source) / "additional_chat_templates"))  // transformers' named (and default) templates
    fs::copy(fs::path(source) / "additional_chat_templates", fs::path(out_dir) / "additional_chat_templates",
             fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  log::info("copied the tokenizer of ", source, " beside it");
  // transformers picks the tokenizer class with the directory's config.json too: the export's
  // (written here) must lead it to the class the run tokenized with.
  try {
    const std::string run = Tokenizer(source).reading(), exported = Tokenizer(out_dir).reading();
    const auto class_of = [](const std::string& reading) { return reading.substr(0, reading.find(" (")); };
    if (class_of(run) != class_of(exported))
      log::warn("transformers reads the exported tokenizer as ", exported, " but the run's as ", run,
                ": its ids may differ from training's; set tokenizer_class in ", out_dir,
                "/tokenizer_config.json to the run's class");
  } catch (const std::exception& e) {
    log::warn("the exported tokenizer does not read as the run's: ", e.what());
  }
}
}  // namespace

int run_export(const std::string& checkpoint_dir, const std::string& out_dir, bool merge) {
  if (merge) {
    export_merged(checkpoint_dir, out_dir);
    log::info("merged the adapters of ", checkpoint_dir, " into its base: ", out_dir,
              " (config.json + model.safetensors, float32)");
  } else {
    export_hf(checkpoint_dir, out_dir);
    log::info("exported ", checkpoint_dir, " to ", out_dir);
  }
  copy_tokenizer(checkpoint_dir, out_dir);
  return 0;
}

}  // namespace ptrain
