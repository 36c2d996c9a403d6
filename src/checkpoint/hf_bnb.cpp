#include <ATen/ATen.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/hf.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"
#include "quant/blockwise8.h"
#include "quant/nf4_math.h"

// Pre-quantized bitsandbytes checkpoints: config.json's quantization_config and the tensors
// transformers saves for each 4-bit Linear, read as stored.

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const kQuantState = ".quant_state.bitsandbytes__nf4";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_false_or_null(const json& v) { return v.is_null() || (v.is_boolean() && !v.get<bool>()); }

}  // namespace

HfStorage read_hf_storage(const std::string& dir) {
  const std::string path = hf_config_file(dir);
  const json c = read_json_file(path);
  HfStorage s;
  if (!c.is_object() || !c.contains("quantization_config") || c["quantization_config"].is_null()) return s;
  const json& q = c["quantization_config"];
  const std::string where = path + ": quantization_config";
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw UnsupportedInput(where + "." + key + " = " + (q.contains(key) ? q[key].dump() : "(missing)") + ": " + why +
                           ". ptrain loads bitsandbytes NF4 checkpoints (load_in_4bit, bnb_4bit_quant_type \"nf4\") "
                           "and full-precision weights; see docs/qlora.md");
  };
  if (!q.is_object()) throw UnsupportedInput(where + " is not an object");
  const std::string method =
      q.contains("quant_method") && q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : "";
  if (method != "bitsandbytes")
    refuse("quant_method", "this quantization method (GPTQ, AWQ, HQQ, FP8, ...) is not one ptrain reads");
  for (const char* k : {"load_in_8bit", "_load_in_8bit"})
    if (q.contains(k) && !is_false_or_null(q[k])) refuse(k, "8-bit (LLM.int8) weights are not supported");
  for (const char* k : {"load_in_4bit", "_load_in_4bit"})
    if (!q.contains(k) || !is_true(q[k])) refuse(k, "only 4-bit bitsandbytes checkpoints are read");
  if (!q.contains("bnb_4bit_quant_type") || q["bnb_4bit_quant_type"] != "nf4")
    refuse("bnb_4bit_quant_type", "only NF4 is implemented (FP4 is not)");
  if (q.contains("bnb_4bit_quant_storage") && q["bnb_4bit_quant_storage"] != "uint8")
    refuse("bnb_4bit_quant_storage", "the 4-bit codes must be packed in uint8");
  if (q.contains("llm_int8_has_fp16_weight") && !is_false_or_null(q["llm_int8_has_fp16_weight"]))
    refuse("llm_int8_has_fp16_weight", "a 4-bit checkpoint holds no fp16 weights");
  if (q.contains("bnb_4bit_use_double_quant") && !q["bnb_4bit_use_double_quant"].is_boolean())
    refuse("bnb_4bit_use_double_quant", "must be true or false");
  // Keys that describe how transformers computed or loaded, not what the file holds: the compute
  // dtype is ptrain's precision mode; the LLM.int8 options do nothing to 4-bit weights; a skipped
  // module is stored in a float dtype, which the tensor check accepts only where ptrain wants it.
  static const std::set<std::string> known{"quant_method",
                                           "load_in_4bit",
                                           "_load_in_4bit",
                                           "load_in_8bit",
                                           "_load_in_8bit",
                                           "bnb_4bit_quant_type",
                                           "bnb_4bit_quant_storage",
                                           "bnb_4bit_use_double_quant",
                                           "bnb_4bit_compute_dtype",
                                           "llm_int8_has_fp16_weight",
                                           "llm_int8_threshold",
                                           "llm_int8_skip_modules",
                                           "llm_int8_enable_fp32_cpu_offload"};
  for (auto it = q.begin(); it != q.end(); ++it)
    if (!known.count(it.key()))
      refuse(it.key(), "an option ptrain does not know, so it cannot say the weights are right");
  s.nf4 = true;
  s.double_quant = q.value("bnb_4bit_use_double_quant", false);
  return s;
}

std::map<std::string, StoredTensor> bnb_nf4_tensors(const std::string& weight, int64_t numel, bool double_quant) {
  const int64_t blocks = ceil_div(numel, nf4::kBlock);
  std::map<std::string, StoredTensor> t;
  t[weight] = {"U8", {ceil_div(numel, 2), 1}};
  t[weight + ".absmax"] = {double_quant ? "U8" : "F32", {blocks}};
  t[weight + ".quant_map"] = {"F32", {16}};
  t[weight + kQuantState] = {"U8", {-1}};
  if (double_quant) {
    t[weight + ".nested_absmax"] = {"F32", {ceil_div(blocks, nf4::kStatsBlock)}};
    t[weight + ".nested_quant_map"] = {"F32", {256}};
  }
  return t;
}

nf4::Quantized read_bnb_nf4(const HfCheckpoint& ckpt, const std::string& weight, const std::vector<int64_t>& shape,
                            bool double_quant) {
  const std::string state_name = weight + kQuantState;
  auto refuse = [&](const std::string& what) {
    throw UnsupportedInput("bitsandbytes weight '" + weight + "': " + what +
                           " (ptrain reads NF4 in blocks of 64 with float32 statistics, as bitsandbytes writes it)");
  };
  json state;
  try {
    at::Tensor blob = ckpt.tensor(state_name).contiguous();
    state = json::parse(std::string(reinterpret_cast<const char*>(blob.data_ptr<uint8_t>()), blob.numel()));
  } catch (const json::exception& e) {
    refuse(std::string("its quant_state is not valid JSON: ") + e.what());
  }
  static const std::set<std::string> keys{"quant_type",       "blocksize",    "dtype",        "shape",
                                          "nested_blocksize", "nested_dtype", "nested_offset"};
  if (!state.is_object()) refuse("its quant_state is not a JSON object");
  for (auto it = state.begin(); it != state.end(); ++it)
    if (!keys.count(it.key())) refuse("quant_state key \"" + it.key() + "\" is not one bitsandbytes 0.50 writes");
  if (state.value("quant_type", json()) != "nf4")
    refuse("quant_state.quant_type is " + state.value("quant_type", json()).dump());
  if (state.value("blocksize", json()) != nf4::kBlock)
    refuse("quant_state.blocksize is " + state.value("blocksize", json()).dump());
  // The dtype the weight had before quantization: it says nothing about how to read the codes, but
  // a value bitsandbytes never writes means the blob is not what it claims.
  static const std::set<std::string> dtypes{"float32", "float16", "bfloat16"};
  const json dtype = state.value("dtype", json());
  if (!dtype.is_string() || !dtypes.count(dtype.get<std::string>()))
    refuse("quant_state.dtype is " + dtype.dump() + ", not float32, float16 or bfloat16");
  if (state.value("shape", json()) != json(shape))
    refuse("quant_state.shape " + state.value("shape", json()).dump() + " is not the model's " + json(shape).dump());
  const bool nested = state.contains("nested_blocksize");
  if (nested != double_quant)
    refuse(std::string("its statistics are ") + (nested ? "" : "not ") +
           "double-quantized, unlike config.json's bnb_4bit_use_double_quant");
  if (nested && (state["nested_blocksize"] != nf4::kStatsBlock || state.value("nested_dtype", json()) != "float32" ||
                 !state.value("nested_offset", json()).is_number()))
    refuse("quant_state nested_blocksize/nested_dtype/nested_offset are " + state.dump());
  auto equal_table = [&](const std::string& name, const at::Tensor& want) {
    if (!at::equal(ckpt.tensor(name).to(at::kFloat).reshape({-1}), want))
      refuse("'" + name + "' is not bitsandbytes' table (a custom code cannot be read as NF4)");
  };
  equal_table(weight + ".quant_map", at::from_blob(const_cast<float*>(nf4::kCode), {16}, at::kFloat));
  if (nested) equal_table(weight + ".nested_quant_map", q8::dynamic_map(true));

  nf4::Quantized q;
  q.shape = shape;
  q.numel = 1;
  for (int64_t d : shape) q.numel *= d;
  q.double_quant = double_quant;
  q.packed = ckpt.tensor(weight).reshape({-1});
  q.absmax = ckpt.tensor(weight + ".absmax");
  if (nested) {
    q.absmax2 = ckpt.tensor(weight + ".nested_absmax");
    q.offset = state["nested_offset"].get<float>();
  }
  return q;
}

}  // namespace ptrain
