#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "optim/adamw.h"
#include "parallel/fsdp.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

json shape_json(const LlamaShape& s) {
  return {{"dim", s.dim},           {"n_layers", s.n_layers},     {"n_heads", s.n_heads},
          {"n_kv_heads", s.n_kv_heads}, {"head_dim", s.head_dim}, {"ffn_dim", s.ffn_dim},
          {"vocab_size", s.vocab_size}, {"max_seq_len", s.max_seq_len}, {"rope_theta", s.rope_theta},
          {"norm_eps", s.norm_eps}, {"tie_embeddings", s.tie_embeddings},
          {"rope_scaling", {{"factor", s.rope_scaling.factor},
                            {"low_freq_factor", s.rope_scaling.low_freq_factor},
                            {"high_freq_factor", s.rope_scaling.high_freq_factor},
                            {"original_max_seq_len", s.rope_scaling.original_max_seq_len}}}};
}

LlamaShape shape_from_json(const json& j) {
  LlamaShape s;
  s.dim = j.at("dim");
  s.n_layers = j.at("n_layers");
  s.n_heads = j.at("n_heads");
  s.n_kv_heads = j.at("n_kv_heads");
  s.head_dim = j.at("head_dim");
  s.ffn_dim = j.at("ffn_dim");
  s.vocab_size = j.at("vocab_size");
  s.max_seq_len = j.at("max_seq_len");
  s.rope_theta = j.at("rope_theta");
  s.norm_eps = j.at("norm_eps");
  s.tie_embeddings = j.at("tie_embeddings");
  const auto& r = j.at("rope_scaling");
  s.rope_scaling = {r.at("factor"), r.at("low_freq_factor"), r.at("high_freq_factor"), r.at("original_max_seq_len")};
  return s;
}

int64_t step_of(const fs::path& p) {
  static const std::regex re("step_([0-9]+)");
  std::smatch m;
  const std::string name = p.filename().string();
  return std::regex_match(name, m, re) ? std::stoll(m[1]) : -1;
}

std::vector<fs::path> complete_checkpoints(const std::string& root) {
  std::vector<fs::path> out;
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && step_of(e.path()) >= 0 && fs::is_regular_file(e.path() / "meta.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

json read_meta(const std::string& dir) {
  const fs::path p = fs::path(dir) / "meta.json";
  if (!fs::is_regular_file(p)) throw RuntimeError("'" + dir + "' is not a complete checkpoint (no meta.json)");
  try {
    json j = json::parse(read_text_file(p.string()));
    if (j.value("format_version", 0) != kFormatVersion)
      throw RuntimeError("checkpoint '" + dir + "' has format version " + std::to_string(j.value("format_version", 0)) +
                         ", this ptrain reads version " + std::to_string(kFormatVersion));
    return j;
  } catch (const json::exception& e) {
    throw RuntimeError("checkpoint '" + dir + "': meta.json is corrupt: " + e.what());
  }
}

}  // namespace

std::string save_checkpoint(const std::string& root, const FsdpModel& model, const AdamW& optim,
                            const TrainProgress& progress, int64_t keep, const std::string& config_toml) {
  fs::create_directories(root);
  const fs::path final_dir = fs::path(root) / ("step_" + std::to_string(progress.step));
  const fs::path tmp = fs::path(root) / (".step_" + std::to_string(progress.step) + ".tmp." + std::to_string(::getpid()));
  remove_tree(tmp.string());
  fs::create_directories(tmp);

  std::vector<std::pair<std::string, at::Tensor>> params;
  json units = json::array();
  for (const auto& u : model.units()) {
    params.emplace_back(u.layout.name, u.shard.detach());
    units.push_back({{"name", u.layout.name}, {"numel", u.layout.numel}});
  }
  write_safetensors((tmp / "model.safetensors").string(), params);
  write_safetensors((tmp / "optimizer.safetensors").string(), optim.state());
  write_safetensors((tmp / "rng.safetensors").string(), {{"cpu", at::detail::getDefaultCPUGenerator().get_state()}});
  write_file_atomic((tmp / "config.toml").string(), config_toml);
  json meta = {{"format_version", kFormatVersion},
               {"step", progress.step},
               {"samples", progress.samples},
               {"optimizer_steps", optim.steps()},
               {"world_size", 1},
               {"precision", model.policy().mode},
               {"master_dtype", c10::toString(model.policy().master_dtype)},
               {"shape", shape_json(model.shape())},
               {"units", units}};
  write_file_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");  // last: marks completeness
  fsync_path(tmp.string());

  // Replacing an existing step_N (a rerun of the same step): move it aside first, so there is
  // always one complete step_N on disk except between two renames.
  fs::path old;
  if (fs::exists(final_dir)) {
    old = fs::path(root) / (".step_" + std::to_string(progress.step) + ".old." + std::to_string(::getpid()));
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root);
  if (!old.empty()) remove_tree(old.string());

  auto all = complete_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != final_dir) remove_tree(all[i].string());
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& root) {
  auto all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

void load_checkpoint(const std::string& dir, FsdpModel& model, AdamW* optim, TrainProgress& progress) {
  json meta = read_meta(dir);
  try {
    const LlamaShape saved = shape_from_json(meta.at("shape"));
    if (shape_json(saved) != shape_json(model.shape()))
      throw RuntimeError("checkpoint '" + dir + "' was written for a different model shape: " + shape_json(saved).dump() +
                         "; the config describes " + shape_json(model.shape()).dump());
    if (meta.at("master_dtype").get<std::string>() != c10::toString(model.policy().master_dtype))
      throw RuntimeError("checkpoint '" + dir + "' holds " + meta.at("master_dtype").get<std::string>() +
                         " master weights but precision mode '" + model.policy().mode + "' keeps " +
                         c10::toString(model.policy().master_dtype));
    SafetensorsFile params((fs::path(dir) / "model.safetensors").string());
    at::NoGradGuard no_grad;
    for (auto& u : model.units()) {
      at::Tensor t = params.tensor(u.layout.name);
      if (t.numel() != u.layout.numel || t.scalar_type() != u.shard.scalar_type())
        throw RuntimeError("checkpoint '" + dir + "': unit '" + u.layout.name + "' has " + std::to_string(t.numel()) +
                           " elements of " + c10::toString(t.scalar_type()) + ", expected " + std::to_string(u.layout.numel));
      u.shard.copy_(t);
    }
    if (optim) {
      SafetensorsFile state((fs::path(dir) / "optimizer.safetensors").string());
      for (auto& [name, t] : optim->state()) {
        at::Tensor src = state.tensor(name);
        if (src.sizes() != t.sizes()) throw RuntimeError("checkpoint '" + dir + "': optimizer state '" + name + "' has the wrong size");
        t.copy_(src);
      }
      optim->set_steps(meta.at("optimizer_steps").get<int64_t>());
    }
    SafetensorsFile rng((fs::path(dir) / "rng.safetensors").string());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.tensor("cpu").clone());
    progress.step = meta.at("step").get<int64_t>();
    progress.samples = meta.at("samples").get<uint64_t>();
  } catch (const json::exception& e) {
    throw RuntimeError("checkpoint '" + dir + "': meta.json lacks a field: " + e.what());
  }
}

void export_hf(const std::string& checkpoint_dir, const std::string& out_dir) {
  json meta = read_meta(checkpoint_dir);
  const LlamaShape shape = shape_from_json(meta.at("shape"));
  SafetensorsFile params((fs::path(checkpoint_dir) / "model.safetensors").string());
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& layout : llama_units(shape, 0.02)) {
    at::Tensor flat = params.tensor(layout.name).to(at::kFloat);
    if (flat.numel() != layout.numel) throw RuntimeError("checkpoint '" + checkpoint_dir + "': unit '" + layout.name + "' has the wrong size");
    for (const auto& slot : layout.slots) named.emplace_back(slot.name, flat.narrow(0, slot.offset, slot.numel).view(slot.shape));
  }
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), named, {{"format", "pt"}});
  write_hf_config(out_dir, shape);
}

}  // namespace ptrain
