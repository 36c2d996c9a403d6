#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "checkpoint/hf.h"
#include "checkpoint/meta.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "model/plan.h"
#include "optim/optimizer.h"
#include "parallel/collectives.h"
#include "parallel/fsdp.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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
    if (e.is_directory() && step_of(e.path()) >= 0 && fs::is_regular_file(e.path() / "meta.json"))
      out.push_back(e.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) < step_of(b); });
  return out;
}

json read_meta(const std::string& dir) {
  const fs::path p = fs::path(dir) / "meta.json";
  if (!fs::is_regular_file(p)) throw RuntimeError("'" + dir + "' is not a complete checkpoint (no meta.json)");
  try {
    json j = json::parse(read_text_file(p.string()));
    validate_checkpoint_meta(j, dir);
    return j;
  } catch (const json::exception& e) {
    throw RuntimeError("checkpoint '" + dir + "': meta.json is corrupt: " + e.what());
  }
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

json sum_json(const FileSum& s) { return {{"bytes", s.bytes}, {"crc32", hex32(s.crc32)}}; }

// The file `name` of checkpoint `dir` against the size and CRC-32 meta.json records for it.
// Checkpoints written before checksums (no "files" in meta.json) are read unverified.
void verify_file(const std::string& dir, const json& meta, const std::string& name) {
  if (!meta.contains("files")) return;
  const json& files = meta.at("files");
  if (!files.contains(name)) throw RuntimeError("checkpoint '" + dir + "': meta.json records no file '" + name + "'");
  const fs::path path = fs::path(dir) / name;
  if (!fs::is_regular_file(path)) throw RuntimeError("checkpoint '" + dir + "': '" + name + "' is missing");
  const FileSum got = file_sum(path.string());
  const uint64_t bytes = files[name].at("bytes").get<uint64_t>();
  const std::string crc = files[name].at("crc32").get<std::string>();
  if (got.bytes != bytes)
    throw RuntimeError("checkpoint '" + dir + "': '" + name + "' has " + std::to_string(got.bytes) +
                       " bytes, meta.json records " + std::to_string(bytes) + " (truncated or overwritten)");
  if (hex32(got.crc32) != crc)
    throw RuntimeError("checkpoint '" + dir + "': '" + name + "' is damaged: its CRC-32 is " + hex32(got.crc32) +
                       ", meta.json records " + crc);
}

int64_t identity(int64_t e) { return e; }

// Entries of an optimizer state vector that cover this rank's owned elements of its unit.
at::Tensor owned_state(const FsdpModel& model, const OptimState& s) {
  const FlatUnit& u = model.trained_units().at(s.target);
  return s.tensor.narrow(0, 0, s.index(u.shard_offset + u.owned()) - s.index(u.shard_offset));
}

std::string shard_file(const std::string& kind, int rank) {
  return kind + ".rank" + std::to_string(rank) + ".safetensors";
}

std::string sums_file(int rank) { return "sums.rank" + std::to_string(rank) + ".json"; }

// Reads part of a unit-wide vector out of the rank files that hold it: the entries covering
// unit elements [begin, end), where `index` maps element offsets to vector positions (the
// identity for parameters; see OptimState).
class ShardReader {
 public:
  ShardReader(std::string dir, const json& meta, std::string kind, int world_size)
      : dir_(std::move(dir)), meta_(meta), kind_(std::move(kind)), files_(world_size) {}
  void copy(const std::string& key, int64_t numel, int64_t begin, int64_t end, const at::Tensor& dst,
            const std::function<int64_t(int64_t)>& index = identity) {
    const int64_t ws = static_cast<int64_t>(files_.size()), S = shard_numel(numel, ws);
    const int64_t lo = index(begin), hi = index(end);
    for (int64_t k = 0; k < ws; ++k) {
      const int64_t k_lo = index(std::min(k * S, numel)), k_hi = index(std::min((k + 1) * S, numel));
      const int64_t a = std::max(lo, k_lo), b = std::min(hi, k_hi);
      if (a >= b) continue;
      at::Tensor src = file(static_cast<int>(k)).tensor(key);
      if (src.numel() != k_hi - k_lo)
        throw RuntimeError("checkpoint '" + dir_ + "': '" + key + "' in " + shard_file(kind_, static_cast<int>(k)) +
                           " has " + std::to_string(src.numel()) + " elements, expected " +
                           std::to_string(k_hi - k_lo));
      dst.narrow(0, a - lo, b - a).copy_(src.narrow(0, a - k_lo, b - a));
    }
  }
  // The tensor names of one rank's file (every rank's file holds the same names).
  std::vector<std::string> names(int rank) {
    std::vector<std::string> out;
    for (const auto& e : file(rank).entries()) out.push_back(e.name);
    return out;
  }

 private:
  SafetensorsFile& file(int rank) {
    if (!files_[rank]) {
      verify_file(dir_, meta_, shard_file(kind_, rank));  // every byte read is a byte written
      files_[rank] = std::make_unique<SafetensorsFile>((fs::path(dir_) / shard_file(kind_, rank)).string());
    }
    return *files_[rank];
  }
  std::string dir_;
  const json& meta_;
  std::string kind_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

}  // namespace

namespace {

// This rank's part of a checkpoint in `tmp`: its owned slices of the trained units (shard padding
// is not stored), its optimizer state, its RNG, and a file of each one's size and CRC-32. Returns
// the failure ("" when written): a full disk is caught, so that every rank learns of it.
std::string write_rank_part(const fs::path& tmp, const FsdpModel& model, const Optimizer& optim) {
  const int rank = model.comm().rank();
  std::vector<std::pair<std::string, at::Tensor>> params, state;
  for (const auto& u : model.trained_units())  // a frozen LoRA base is rebuilt, not saved
    params.emplace_back(u.layout.name, u.shard.detach().narrow(0, 0, u.owned()));
  for (const auto& s : optim.state()) state.emplace_back(s.key, owned_state(model, s));
  try {
    json sums = json::object();
    sums[shard_file("model", rank)] = sum_json(write_safetensors((tmp / shard_file("model", rank)).string(), params));
    sums[shard_file("optimizer", rank)] =
        sum_json(write_safetensors((tmp / shard_file("optimizer", rank)).string(), state));
    sums[shard_file("rng", rank)] = sum_json(write_safetensors(
        (tmp / shard_file("rng", rank)).string(), {{"cpu", at::detail::getDefaultCPUGenerator().get_state()}}));
    write_file_atomic((tmp / sums_file(rank)).string(), sums.dump() + "\n");
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Some rank failed to write: the temporary directory is removed before any rank reports.
[[noreturn]] void abandon(const std::string& root, const fs::path& tmp, const std::string& step, int failed_ranks,
                          const std::string& failure, Collectives& comm) {
  const std::string previous = latest_checkpoint(root);
  if (comm.rank() == 0) {
    try {
      remove_tree(tmp.string());
    } catch (const std::exception& e) {
      log::warn("could not remove ", tmp.string(), ": ", e.what());
    }
  }
  comm.barrier();  // the temporary is gone before any rank reports (and may take the job down)
  throw RuntimeError("checkpoint " + step + " was not written: " + std::to_string(failed_ranks) +
                     " rank(s) failed to write their part" + (failure.empty() ? "" : " (here: " + failure + ")") +
                     "; its temporary directory is removed and " +
                     (previous.empty() ? std::string("no earlier checkpoint exists")
                                       : "the previous checkpoint " + previous + " is intact"));
}

// Every rank's files as each recorded them, each checked for its size (rank 0; the records are
// then removed).
json collect_sums(const fs::path& tmp, const std::string& step, int world_size) {
  json files = json::object();
  for (int r = 0; r < world_size; ++r) {
    const fs::path sums = tmp / sums_file(r);
    const json recorded = json::parse(read_text_file(sums.string()));
    for (const auto& [name, sum] : recorded.items()) {
      if (fs::file_size(tmp / name) != sum.at("bytes").get<uint64_t>())
        throw RuntimeError("checkpoint " + step + ": " + name + " is not the size rank " + std::to_string(r) +
                           " wrote");
      files[name] = sum;
    }
    remove_tree(sums.string());
  }
  return files;
}

json checkpoint_meta(const FsdpModel& model, const Optimizer& optim, const TrainProgress& progress, json files) {
  json units = json::array();
  for (const auto& u : model.trained_units()) units.push_back({{"name", u.layout.name}, {"numel", u.layout.numel}});
  const LoraOptions& lora = model.lora();
  return {{"format_version", kCheckpointFormatVersion},
          {"step", progress.step},
          {"samples", progress.samples},
          {"num_tokens", progress.num_tokens},
          {"data", progress.data},
          {"optimizer_steps", optim.steps()},
          {"world_size", model.comm().world_size()},
          {"precision", model.policy().mode},
          {"master_dtype", c10::toString(model.policy().master_dtype)},
          {"lora", lora.enabled},
          {"lora_config",
           {{"rank", lora.rank},
            {"alpha", lora.alpha},
            {"dropout", lora.dropout},
            {"rslora", lora.rslora},
            {"targets", lora.targets}}},
          {"shape", shape_json(model.shape())},
          {"units", units},
          {"files", std::move(files)}};
}

// Renames the complete temporary directory to step_N. Replacing an existing step_N (a rerun of the
// same step) moves it aside first, so a complete step_N is on disk at every moment except between
// two renames. Then keeps the newest `keep` checkpoints.
void publish(const std::string& root, const fs::path& tmp, const fs::path& final_dir, const std::string& step,
             int64_t keep) {
  fsync_path(tmp.string());
  fs::path old;
  if (fs::exists(final_dir)) {
    old = fs::path(root) / ("." + step + ".old");
    remove_tree(old.string());
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root);
  if (!old.empty()) remove_tree(old.string());
  auto all = complete_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != final_dir) remove_tree(all[i].string());
}

}  // namespace

std::string save_checkpoint(const std::string& root, const FsdpModel& model, const Optimizer& optim,
                            const TrainProgress& progress, int64_t keep, const std::string& config_toml) {
  Collectives& comm = model.comm();
  const std::string step = "step_" + std::to_string(progress.step);
  const fs::path final_dir = fs::path(root) / step;
  const fs::path tmp = fs::path(root) / ("." + step + ".tmp");
  if (comm.rank() == 0) {
    fs::create_directories(root);
    remove_tree(tmp.string());  // leftovers of a crashed attempt
    fs::create_directories(tmp);
  }
  comm.barrier();
  const std::string failure = write_rank_part(tmp, model, optim);
  // (also the barrier after every rank's writes)
  if (const int n = ranks_where(comm, !failure.empty(), model.device()); n > 0)
    abandon(root, tmp, step, n, failure, comm);
  if (comm.rank() == 0) {
    json files = collect_sums(tmp, step, comm.world_size());
    write_file_atomic((tmp / "config.toml").string(), config_toml);
    const json meta = checkpoint_meta(model, optim, progress, std::move(files));
    write_file_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");  // last: marks completeness
    publish(root, tmp, final_dir, step, keep);
  }
  comm.barrier();
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& root) {
  auto all = complete_checkpoints(root);
  return all.empty() ? "" : all.back().string();
}

void recover_checkpoint_dir(const std::string& root) {
  if (!fs::is_directory(root)) return;
  static const std::regex temp(R"(\.(step_[0-9]+)\.(tmp|old))");
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(root)) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  for (const auto& p : found) {
    std::smatch m;
    const std::string name = p.filename().string();
    if (!std::regex_match(name, m, temp)) continue;
    const fs::path final_dir = fs::path(root) / m[1].str();
    if (m[2] == "old" && !fs::exists(final_dir) && fs::is_regular_file(p / "meta.json")) {
      fs::rename(p, final_dir);
      fsync_path(root);
      log::warn("checkpoint ", final_dir.string(), " was left as ", name,
                " by a run stopped in the middle of rewriting it; put back");
    } else {
      remove_tree(p.string());
      log::warn("removed ", p.string(), ": the unfinished write of a run that stopped or failed");
    }
  }
}

std::string resume_latest(const std::string& root, FsdpModel& model, Optimizer* optim, TrainProgress& progress) {
  auto all = complete_checkpoints(root);
  std::vector<std::string> skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string why;
    try {
      load_checkpoint(it->string(), model, optim, progress);
    } catch (const std::exception& e) {
      why = e.what();
    }
    // Every rank must take the same checkpoint: one that any rank cannot read is skipped by all.
    if (ranks_where(model.comm(), !why.empty(), model.device()) == 0) {
      for (const auto& s : skipped) log::warn(s);
      if (!skipped.empty())
        log::warn("resuming from ", it->string(), ", the newest checkpoint that reads back intact (", skipped.size(),
                  " newer one(s) skipped)");
      return it->string();
    }
    if (why.empty()) why = "another rank could not read its part";
    skipped.push_back(why.find(it->string()) != std::string::npos ? "skipped: " + why
                                                                  : "skipped checkpoint " + it->string() + ": " + why);
  }
  if (all.empty()) return "";
  std::string msg = "checkpoint.resume = \"auto\": none of the " + std::to_string(all.size()) + " checkpoint(s) in " +
                    root + " reads back intact:";
  for (const auto& s : skipped) msg += "\n  " + s;
  throw RuntimeError(msg + "\nset checkpoint.resume = \"\" to start fresh, or to one of them to see its error alone");
}

void load_checkpoint(const std::string& dir, FsdpModel& model, Optimizer* optim, TrainProgress& progress) {
  json meta = read_meta(dir);
  try {
    const LlamaShape saved = shape_from_json(meta.at("shape"));
    if (shape_json(saved) != shape_json(model.shape()))
      throw RuntimeError("checkpoint '" + dir + "' was written for a different model shape: " +
                         shape_json(saved).dump() + "; the config describes " + shape_json(model.shape()).dump());
    // Resuming needs the same master dtype (the optimizer state belongs to it); loading weights
    // alone (eval, export) converts them, e.g. a bf16 run evaluated in float32.
    if (optim && meta.at("master_dtype").get<std::string>() != c10::toString(model.policy().master_dtype))
      throw RuntimeError("checkpoint '" + dir + "' holds " + meta.at("master_dtype").get<std::string>() +
                         " master weights but precision mode '" + model.policy().mode + "' keeps " +
                         c10::toString(model.policy().master_dtype));
    if (meta.value("lora", false) != model.lora().enabled)
      throw RuntimeError("checkpoint '" + dir + "' holds " +
                         (meta.value("lora", false) ? "LoRA adapters" : "full model weights") + " but the config " +
                         (model.lora().enabled ? "enables" : "does not enable") + " LoRA; match lora.enabled");
    const int saved_ws = meta.at("world_size").get<int>();
    ShardReader params(dir, meta, "model", saved_ws), state(dir, meta, "optimizer", saved_ws);
    at::NoGradGuard no_grad;
    for (auto& u : model.trained_units()) {
      u.shard.detach().zero_();
      params.copy(u.layout.name, u.layout.numel, u.shard_offset, u.shard_offset + u.owned(),
                  u.shard.detach().narrow(0, 0, u.owned()));
    }
    if (optim) {
      // The state this optimizer keeps is exactly the state the checkpoint holds: a tensor more
      // (a Kahan compensation, 8-bit codes) or less means other optimizer settings wrote it, and
      // resuming would drop or invent state.
      std::set<std::string> keeps, held;
      for (const auto& s : optim->state()) keeps.insert(s.key);
      for (const auto& name : state.names(0)) held.insert(name);
      const std::string settings =
          "; resume with the optimizer and precision settings it was written with "
          "(optimizer.name, precision.mode, precision.kahan_summation)";
      for (const auto& name : held)
        if (!keeps.count(name))
          throw RuntimeError("checkpoint '" + dir + "' holds optimizer state '" + name +
                             "' that this run's optimizer does not keep" + settings);
      for (const auto& key : keeps)
        if (!held.count(key))
          throw RuntimeError("checkpoint '" + dir + "' has no optimizer state '" + key +
                             "', which this run's optimizer keeps" + settings);
      for (const auto& s : optim->state()) {
        const FlatUnit& u = model.trained_units().at(s.target);
        s.tensor.zero_();
        state.copy(s.key, u.layout.numel, u.shard_offset, u.shard_offset + u.owned(), owned_state(model, s), s.index);
      }
      optim->set_steps(meta.at("optimizer_steps").get<int64_t>());
    }
    // Same world size: each rank gets its own generator back; otherwise rank 0's.
    const int rng_rank = saved_ws == model.comm().world_size() ? model.comm().rank() : 0;
    verify_file(dir, meta, shard_file("rng", rng_rank));
    SafetensorsFile rng((fs::path(dir) / shard_file("rng", rng_rank)).string());
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng.tensor("cpu").clone());
    progress.step = meta.at("step").get<int64_t>();
    progress.samples = meta.at("samples").get<uint64_t>();
    progress.num_tokens = meta.value("num_tokens", uint64_t{0});  // absent in checkpoints of earlier versions
    progress.data = meta.value("data", std::string());            // absent in checkpoints of earlier versions
  } catch (const json::exception& e) {
    throw RuntimeError("checkpoint '" + dir + "': meta.json lacks a field: " + e.what());
  }
}

void export_hf(const std::string& checkpoint_dir, const std::string& out_dir) {
  json meta = read_meta(checkpoint_dir);
  PlanOptions o;  // the units the checkpoint holds: the trained ones (model/plan.h)
  o.lora.enabled = meta.value("lora", false);
  PeftAdapter a;
  if (o.lora.enabled) {
    const json& l = meta.at("lora_config");
    o.lora.rank = a.rank = l.at("rank").get<int64_t>();
    o.lora.targets = a.targets = l.at("targets").get<std::vector<std::string>>();
    a.alpha = l.at("alpha").get<double>();
    a.dropout = l.at("dropout").get<double>();
    a.rslora = l.value("rslora", false);
  }
  const ModelPlan plan = ModelPlan::make(shape_from_json(meta.at("shape")), o);
  ShardReader params(checkpoint_dir, meta, "model", meta.at("world_size").get<int>());
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& u : plan.trained()) {
    if (u.layout.numel == 0) continue;
    at::Tensor flat = at::empty({u.layout.numel}, at::kFloat);
    params.copy(u.layout.name, u.layout.numel, 0, u.layout.numel, flat);
    for (const auto& slot : u.layout.slots) named.emplace_back(slot.name, slot_view(flat, slot));
  }
  if (o.lora.enabled) {  // adapters only: PEFT's format
    for (const auto& [name, t] : named) a.tensors[name] = t.clone();
    write_peft(out_dir, a);
    return;
  }
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), named, {{"format", "pt"}});
  write_hf_config(out_dir, plan.shape);
}

}  // namespace ptrain
