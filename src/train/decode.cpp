#include "train/decode.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/hf.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "parallel/fsdp.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The next token from float32 logits [vocab] on the CPU.
int32_t pick(const at::Tensor& logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature <= 0) return static_cast<int32_t>(logits.argmax().item<int64_t>());
  at::Tensor l = logits / o.temperature;
  const double inf = std::numeric_limits<double>::infinity();
  if (o.top_k > 0 && o.top_k < l.size(0)) {  // ties with the k-th largest stay, as transformers' TopK
    const at::Tensor kth = std::get<0>(l.topk(o.top_k)).min();
    l = l.masked_fill(l < kth, -inf);
  }
  if (o.top_p < 1.0) {  // drop a token once the more probable ones reach top_p (at least one stays)
    auto [sorted, order] = l.sort(/*dim=*/0, /*descending=*/true);
    const at::Tensor probs = sorted.softmax(0);
    const at::Tensor before = probs.cumsum(0) - probs;
    at::Tensor drop = before >= o.top_p;
    drop[0] = false;
    l = l.index_put({order.masked_select(drop)}, at::scalar_tensor(-inf, l.options()));
  }
  return static_cast<int32_t>(at::multinomial(l.softmax(0), 1, false, gen).item<int64_t>());
}

// The length of `text`'s prefix of whole UTF-8 characters (a trailing incomplete sequence or a
// replacement character, which a later token may complete, held back).
size_t whole_characters(const std::string& text) {
  size_t n = text.size();
  if (n >= 3 && text.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) return n - 3;
  size_t i = n;
  while (i > 0 && i > n - 4 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return n;
  const auto lead = static_cast<unsigned char>(text[i - 1]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return n - (i - 1) < need ? i - 1 : n;
}

}  // namespace

Completion complete(FsdpModel& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& eos,
                    const SamplingOptions& o, const Tokenizer* tok,
                    const std::function<void(const std::string&)>& on_text) {
  const LlamaShape& s = model.shape();
  const auto P = static_cast<int64_t>(prompt.size());
  if (P == 0) throw UsageError("the prompt is empty");
  if (P >= s.max_seq_len)
    throw UsageError("the prompt has " + std::to_string(P) + " tokens; the model has " + std::to_string(s.max_seq_len) +
                     " positions (model.max_seq_len) and needs one for the answer");
  if (!o.stop.empty() && !tok) throw UsageError("stop strings need a tokenizer (data.tokenizer or model.hf_path)");
  const int64_t capacity = std::min(P + o.max_new_tokens, s.max_seq_len);
  at::NoGradGuard no_grad;
  KvCache cache(s, 1, capacity, model.policy().compute_dtype, model.device());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  Completion c;
  c.prompt_tokens = P;
  c.cache_bytes = cache.bytes();
  const std::set<int32_t> stops(eos.begin(), eos.end());
  size_t hold = 0;  // bytes held back while they could be the start of a stop string
  for (const auto& stop : o.stop) hold = std::max(hold, stop.size() - 1);
  size_t shown = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> ids64(prompt.begin(), prompt.end());
  at::Tensor logits = model.next_logits(at::tensor(ids64, at::kLong).view({1, P}).to(model.device()), cache);
  auto t1 = t0;
  for (;;) {
    const int32_t id = pick(logits[0].to(at::kCPU), o, gen);
    if (c.ids.empty()) {
      c.prompt_seconds = since(t0);
      t1 = std::chrono::steady_clock::now();
    }
    c.ids.push_back(id);
    if (stops.count(id)) {
      c.finish = "eos";
      break;
    }
    if (tok) {
      c.text = tok->decode(c.ids);
      size_t cut = std::string::npos;
      for (const auto& stop : o.stop) cut = std::min(cut, c.text.find(stop));
      if (cut != std::string::npos) {
        c.text.resize(cut);
        c.finish = "stop";
        break;
      }
      const size_t ready = whole_characters(c.text.substr(0, c.text.size() > hold ? c.text.size() - hold : 0));
      if (on_text && ready > shown) on_text(c.text.substr(shown, ready - shown));
      shown = std::max(shown, ready);
    }
    // At most max_new_tokens, and prompt + answer within the model's positions.
    if (static_cast<int64_t>(c.ids.size()) >= o.max_new_tokens || P + static_cast<int64_t>(c.ids.size()) >= capacity) {
      c.finish = "length";
      break;
    }
    logits = model.next_logits(at::full({1, 1}, id, at::kLong).to(model.device()), cache);
  }
  c.decode_seconds = since(t1);
  if (tok) {
    if (c.finish == "eos") c.text = tok->decode(std::vector<int32_t>(c.ids.begin(), c.ids.end() - 1));
    if (on_text && c.text.size() > shown) on_text(c.text.substr(shown));
  }
  return c;
}

namespace {
// A JSON object from the model directory (generation_config.json, config.json), or refused naming
// the file: a damaged one is never passed over for another's settings.
json model_json(const fs::path& path) {
  json j;
  try {
    j = json::parse(read_text_file(path.string()));
  } catch (const json::exception& e) {
    throw UnsupportedInput(path.string() + " is not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw UnsupportedInput(path.string() + " must hold a JSON object");
  return j;
}
}  // namespace

std::vector<int32_t> eos_ids(const Config& c, const Tokenizer* tok, const ChatFormat* format) {
  std::set<int32_t> ids;
  if (!c.model.hf_path.empty()) {
    // transformers' generate stops at generation_config.json's eos_token_id (one id or a list).
    for (const fs::path& p :
         {fs::path(c.model.hf_path) / "generation_config.json", fs::path(hf_config_file(c.model.hf_path))}) {
      if (!fs::is_regular_file(p)) continue;
      const json j = model_json(p);
      if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
      const json& v = j["eos_token_id"];
      for (const json& id : v.is_array() ? v : json::array({v})) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= c.model.shape.vocab_size)
          throw UnsupportedInput(p.string() + ": eos_token_id " + v.dump() + " must be a token id in [0, " +
                                 std::to_string(c.model.shape.vocab_size) + ") or a list of them");
        ids.insert(id.get<int32_t>());
      }
      break;
    }
  }
  if (tok) {
    if (const auto [bos, eos] = document_markers(*tok); !eos.empty())
      if (auto id = tok->splitting_token(eos)) ids.insert(*id);
    if (format)
      if (auto id = tok->splitting_token(end_of_turn(*format))) ids.insert(*id);
  }
  return {ids.begin(), ids.end()};
}

// A model directory's generation_config.json may ask for sampling settings that transformers
// applies by default; ptrain decodes as its flags say, and says which settings it leaves.
void warn_generation_settings_left(const Config& c, const SamplingOptions& o) {
  if (c.model.hf_path.empty()) return;
  const fs::path gc = fs::path(c.model.hf_path) / "generation_config.json";
  if (!fs::is_regular_file(gc)) return;
  const json j = model_json(gc);
  std::string left;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "eos_token_id" && it.key() != "bos_token_id" && it.key() != "pad_token_id" &&
        it.key() != "transformers_version" && it.key() != "_from_model_config")
      left += (left.empty() ? "" : ", ") + it.key() + " = " + it.value().dump();
  if (!left.empty())
    log::warn(gc.string(), " sets ", left, "; ptrain generate decodes as its own flags say (--temperature ",
              o.temperature, ", --top-k ", o.top_k, ", --top-p ", o.top_p, ") and reads only its eos_token_id");
}

}  // namespace ptrain
