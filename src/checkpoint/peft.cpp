#include "checkpoint/peft.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "model/layout.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kPrefix = "base_model.model.";
}  // namespace

PeftAdapter read_peft(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  PeftAdapter a;
  try {
    json cfg = json::parse(read_text_file(cfg_path));
    if (cfg.value("peft_type", "") != "LORA")
      throw RuntimeError(cfg_path + ": peft_type is '" + cfg.value("peft_type", "") + "', ptrain reads LORA adapters");
    if (cfg.value("use_dora", false) || cfg.value("use_rslora", false))
      throw RuntimeError(cfg_path + ": DoRA / rsLoRA adapters are not supported; plain LoRA only");
    a.rank = cfg.at("r").get<int64_t>();
    a.alpha = cfg.at("lora_alpha").get<double>();
    a.dropout = cfg.value("lora_dropout", 0.0);
    a.base_model = cfg.value("base_model_name_or_path", "");
    for (const auto& m : cfg.at("target_modules")) {
      const std::string t = target_of_peft_module(m.get<std::string>());
      if (t.empty())
        throw RuntimeError(cfg_path + ": target module '" + m.get<std::string>() +
                           "' is not a Llama projection ptrain adapts");
      a.targets.push_back(t);
    }
  } catch (const json::exception& e) {
    throw RuntimeError(cfg_path + " is not a valid PEFT adapter config: " + e.what());
  }
  SafetensorsFile file((fs::path(dir) / "adapter_model.safetensors").string());
  for (const auto& e : file.entries()) {
    if (e.name.rfind(kPrefix, 0) != 0)
      throw RuntimeError(dir + "/adapter_model.safetensors: tensor '" + e.name + "' does not start with '" + kPrefix +
                         "'");
    a.tensors[e.name.substr(kPrefix.size())] = file.tensor(e.name).to(at::kFloat).clone();
  }
  return a;
}

void write_peft(const std::string& dir, const PeftAdapter& a) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, t] : a.tensors) named.emplace_back(kPrefix + name, t.contiguous());
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), named, {{"format", "pt"}});
  json modules = json::array();
  for (const auto& t : a.targets) modules.push_back(peft_module(t));
  json cfg = {{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"r", a.rank},
              {"lora_alpha", a.alpha},
              {"lora_dropout", a.dropout},
              {"target_modules", modules},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"use_rslora", false},
              {"use_dora", false},
              {"modules_to_save", nullptr},
              {"base_model_name_or_path", a.base_model}};
  write_file_atomic((fs::path(dir) / "adapter_config.json").string(), cfg.dump(2) + "\n");
}

}  // namespace ptrain
