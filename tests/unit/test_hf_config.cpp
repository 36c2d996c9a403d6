// config.json as ptrain reads it, against transformers on ~1,500 variants of each family's
// config.json (tests/fixtures/make_config_fixtures.py: keys absent, null, at other values, alone
// and combined; as transformers 5 and 4.x write them). ptrain may refuse a variant; where it
// accepts one, it must build the network transformers builds from it — the same parameters and
// shapes, RoPE frequencies, softmax scale, norm epsilon, activation and attention.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/hf.h"
#include "checkpoint/meta.h"
#include "common/error.h"
#include "config/config.h"
#include "model/layout.h"
#include "model/llama.h"
#include "test_util.h"
#include "tokenizer/tokenizer_dir.h"

namespace ptrain {
namespace {

using nlohmann::json;
constexpr int64_t kSeqLen = 32;  // data.seq_len of the runs: a window at least this long never applies

using Params = std::map<std::string, std::vector<int64_t>>;

std::string names_only_in(const Params& a, const Params& b) {
  std::string out;
  for (const auto& [name, shape] : a) {
    auto it = b.find(name);
    if (it == b.end())
      out += " " + name;
    else if (it->second != shape)
      out += " " + name + c10::str(c10::IntArrayRef(shape)) + "≠" + c10::str(c10::IntArrayRef(it->second));
  }
  return out;
}

// How ptrain's network for `s` differs from the one transformers built (`hf`); empty when it does not.
std::vector<std::string> differences(const LlamaShape& s, const json& hf) {
  std::vector<std::string> out;
  Params mine;
  for (const auto& unit : llama_units(s, 0.0))
    for (const auto& slot : unit.slots)
      if (!slot.name.starts_with("model.layers.") || slot.name.starts_with("model.layers.0."))
        mine[slot.name] = slot.shape;
  const Params theirs = hf.at("params").get<Params>();
  if (mine != theirs)
    out.push_back("parameters: ptrain's only/different:" + names_only_in(mine, theirs) +
                  "; transformers' only/different:" + names_only_in(theirs, mine));
  if (s.n_layers != hf.at("layers").get<int64_t>())
    out.push_back("layers: ptrain " + std::to_string(s.n_layers) + ", transformers " + hf.at("layers").dump());
  if (hf.at("head_dim") != json::array({s.head_dim}))
    out.push_back("head_dim: ptrain " + std::to_string(s.head_dim) + ", transformers " + hf.at("head_dim").dump());

  const at::Tensor inv = rope_inv_freq(s).to(at::kDouble).contiguous();
  const auto ref = hf.at("inv_freq").get<std::vector<double>>();
  if (inv.numel() != static_cast<int64_t>(ref.size())) {
    out.push_back("RoPE: ptrain has " + std::to_string(inv.numel()) + " frequencies, transformers " +
                  std::to_string(ref.size()));
  } else {
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      worst = std::max(worst, std::abs(inv[static_cast<int64_t>(i)].item<double>() - ref[i]) / std::abs(ref[i]));
    if (!(worst <= 1e-6)) out.push_back("RoPE frequencies differ by " + std::to_string(worst) + " (relative)");
  }
  const double table_scale = s.rope_scaling.table_scale(), hf_table_scale = hf.at("rope_scaling").get<double>();
  if (!(std::abs(table_scale - hf_table_scale) <= 1e-12 * hf_table_scale))
    out.push_back("transformers scales cos/sin by " + hf.at("rope_scaling").dump() + ", ptrain by " +
                  std::to_string(table_scale));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  const auto scales = hf.at("softmax_scale").get<std::vector<double>>();
  if (scales.size() != 1 || std::abs(scales[0] - scale) > 1e-12 * scale)
    out.push_back("softmax scale: ptrain " + std::to_string(scale) + ", transformers " + hf.at("softmax_scale").dump());
  if (hf.at("norm_eps") != json::array({s.norm_eps}))
    out.push_back("RMSNorm epsilon: ptrain " + std::to_string(s.norm_eps) + ", transformers " +
                  hf.at("norm_eps").dump());
  if (hf.at("act") != "SiLUActivation") out.push_back("activation: ptrain SiLU, transformers " + hf.at("act").dump());
  if (hf.at("attention_dropout") != json::array({0.0}))
    out.push_back("attention dropout: ptrain none, transformers " + hf.at("attention_dropout").dump());
  // Each layer's window (transformers' per layer; ptrain's one for every layer), as far as a run
  // of kSeqLen tokens can tell: a window at least that long never applies.
  auto applied = [](int64_t w) { return w > 0 && w < kSeqLen ? w : 0; };
  for (const auto& w : hf.at("sliding_windows"))
    if (applied(w.is_null() ? 0 : w.get<int64_t>()) != applied(s.sliding_window))
      out.push_back("attention window: transformers " + w.dump() + ", ptrain " + std::to_string(s.sliding_window) +
                    " (0: none), in a run of data.seq_len " + std::to_string(kSeqLen));
  if (s.family == Family::mistral) {  // the window export writes back
    const json& w = hf.at("sliding_windows").at(0);
    if (s.sliding_window != (w.is_null() ? 0 : w.get<int64_t>()))
      out.push_back("sliding_window: ptrain " + std::to_string(s.sliding_window) + ", transformers " + w.dump());
  }
  return out;
}

TEST(HfConfig, EveryConfigJsonVariantIsReadAsTransformersReadsItOrRefused) {
  const json fixture = json::parse(read_text_file(test::fixture("config_variants.json")));
  std::vector<std::string> failures;
  std::map<std::string, int> accepted, refused_by_both, refused_by_ptrain_only, rope_types_read;
  for (const auto& v : fixture.at("variants")) {
    const std::string name = v.at("name").get<std::string>();
    const std::string family = v.at("family").get<std::string>();
    test::TempDir dir;
    test::write_text(dir / "config.json", v.at("config").dump());
    test::write_text(dir / "run.toml", "[model]\nhf_path = \"" + dir.path.string() +
                                           "\"\n[data]\nseq_len = " + std::to_string(kSeqLen) + "\n");
    std::optional<Config> config;
    std::string why;
    try {
      config = load_config(dir / "run.toml", {}, Environment{.cuda_available = false, .local = false});
    } catch (const ConfigError& e) {
      why = e.what();
    }
    if (!config) {
      if (v.at("real").get<bool>()) failures.push_back(name + ": refused: " + why);
      ++(v.at("hf").is_null() ? refused_by_both : refused_by_ptrain_only)[family];
      continue;
    }
    if (v.at("hf").is_null()) {
      // A key that does not shape the network (a token id, use_cache) may hold what
      // transformers' validation refuses: the network ptrain builds is the same.
      const std::string field = v.value("hf_error_field", "");
      if (field.empty() || hf_config_key_shapes_network(field, *family_named(family)))
        failures.push_back(name + ": transformers refuses it (" + v.at("hf_error").get<std::string>() +
                           "), ptrain read it");
      continue;
    }
    ++accepted[family];
    ++rope_types_read[config->model.shape.rope_scaling.factor > 0 ? config->model.shape.rope_scaling.type_name()
                                                                  : "default"];
    for (const auto& d : differences(config->model.shape, v.at("hf"))) failures.push_back(name + ": " + d);
  }
  for (const auto& [family, n] : accepted)
    std::cout << family << ": " << n << " variants read as transformers reads them, " << refused_by_ptrain_only[family]
              << " refused that transformers reads, " << refused_by_both[family] << " refused by both\n";
  // Every family's configs are read, not only refused (the unmodified ones above must be).
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) EXPECT_GT(accepted[family], 0) << family;
  // And every RoPE type ptrain implements is among what is compared.
  for (const char* type : {"default", "llama3", "linear", "yarn"}) {
    std::cout << "RoPE " << type << ": " << rope_types_read[type] << " variants read\n";
    EXPECT_GT(rope_types_read[type], 0) << type;
  }
  std::string shown;
  for (size_t i = 0; i < failures.size() && i < 400; ++i) shown += "\n  " + failures[i];
  EXPECT_TRUE(failures.empty()) << failures.size() << " variants read differently from transformers:" << shown;
}

// The key tables against transformers' own code: tests/fixtures/derive_hf_keys.py records every
// config.json key transformers reads for each family (building, training and running the model)
// and every tokenizer_config.json key its tokenizer classes read (hf_keys_read.json). Each must
// be in ptrain's tables — implemented, read without effect, neutral at some values, or refused —
// since ptrain ignores every key its tables do not name. A new transformers release that reads a
// new key fails here, naming it.
TEST(HfKeys, ConfigTableNamesEveryKeyTransformersReads) {
  const json f = json::parse(read_text_file(test::fixture("hf_keys_read.json")));
  for (const auto& [family, keys] : f.at("config").items()) {
    const auto known = hf_config_keys_read(*family_named(family));
    for (const auto& k : keys)
      EXPECT_NE(std::find(known.begin(), known.end(), k.get<std::string>()), known.end())
          << "transformers " << f.at("transformers") << " reads config.json's " << k << " for " << family
          << "; ptrain's table (src/checkpoint/hf.cpp, config_keys) does not name it";
  }
}

TEST(HfKeys, TokenizerTablesNameEveryKeyTransformersReads) {
  const json f = json::parse(read_text_file(test::fixture("hf_keys_read.json")));
  const auto known = tokenizer_config_keys_read();
  for (const auto& [cls, keys] : f.at("tokenizer_config").items())
    for (const auto& k : keys)
      EXPECT_NE(std::find(known.begin(), known.end(), k.get<std::string>()), known.end())
          << "transformers " << f.at("transformers") << "'s " << cls << " reads tokenizer_config.json's " << k
          << "; ptrain's table (src/tokenizer/tokenizer_dir.cpp) does not name it";
}

// A key transformers does not read is ignored, and listed, not refused: a released config.json
// with name and tokenizer keys (SmolLM2's _model_name_or_path, unk_token_id) reads as the same
// network as without them; so does 4.x's pretraining_tp, which transformers 5 reads without effect.
TEST(HfKeys, KeysTransformersDoesNotReadAreIgnoredAndListed) {
  test::TempDir dir;
  json c = json::parse(read_text_file(test::fixture("hf_tiny/config.json")));
  test::write_text(dir / "config.json", c.dump());
  const LlamaShape plain = read_hf_config(dir.path.string());
  c["_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct";
  c["unk_token_id"] = 0;
  c["pretraining_tp"] = 1;
  c["a_future_key"] = {{"x", 1}};
  test::write_text(dir / "config.json", c.dump());
  const LlamaShape with = read_hf_config(dir.path.string());
  EXPECT_EQ(shape_json(with), shape_json(plain));
  const auto ignored = hf_config_ignored_keys(dir.path.string());
  for (const char* k : {"_model_name_or_path", "unk_token_id", "a_future_key"})
    EXPECT_NE(std::find(ignored.begin(), ignored.end(), k), ignored.end()) << k;
  EXPECT_NE(hf_config_ignored_note(dir.path.string()).find("a_future_key"), std::string::npos);
  // A key transformers reads is still refused at a value ptrain does not implement.
  c["is_causal"] = false;
  test::write_text(dir / "config.json", c.dump());
  EXPECT_THROW(read_hf_config(dir.path.string()), UnsupportedInput);
}

// Layer-type lists transformers checks but no layer of these families reads (config_variants.json
// holds what transformers builds at each: the same network): read at any value transformers
// accepts, the same network as without them; refused where transformers fails.
TEST(HfKeys, LayerTypeListsNoLayerReadsAreReadWithoutEffect) {
  test::TempDir dir;
  json c = json::parse(read_text_file(test::fixture("hf_qwen2/config.json")));
  test::write_text(dir / "config.json", c.dump());
  const LlamaShape plain = read_hf_config(dir.path.string());
  c["mlp_layer_types"] = {"sparse", "dense"};
  c["mtp_layer_types"] = {"full_attention"};
  test::write_text(dir / "config.json", c.dump());
  EXPECT_EQ(shape_json(read_hf_config(dir.path.string())), shape_json(plain));
  for (const auto& [key, bad, why] : std::vector<std::tuple<const char*, json, const char*>>{
           {"mlp_layer_types", {"dense", "moe"}, "\"moe\", which transformers refuses"},
           {"mlp_layer_types", {"dense"}, "1 entries for num_hidden_layers 2"},
           {"mtp_layer_types", 3, "a list of layer types"}}) {
    json v = c;
    v[key] = bad;
    test::write_text(dir / "config.json", v.dump());
    try {
      read_hf_config(dir.path.string());
      ADD_FAILURE() << key << " = " << bad << " was read";
    } catch (const UnsupportedInput& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// pad_token_id is read: transformers' nn.Embedding(padding_idx=pad_token_id) gives that row no
// gradient; a negative id counts from the end, one outside the vocabulary is refused.
TEST(HfKeys, PadTokenIdIsTheEmbeddingsPaddingRow) {
  test::TempDir dir;
  json c = json::parse(read_text_file(test::fixture("hf_tiny/config.json")));
  const int64_t vocab = c.at("vocab_size").get<int64_t>();
  for (const auto& [pad, row] : std::vector<std::pair<json, int64_t>>{
           {json(nullptr), -1}, {json(3), 3}, {json(-1), vocab - 1}, {json(vocab - 1), vocab - 1}}) {
    c["pad_token_id"] = pad;
    test::write_text(dir / "config.json", c.dump());
    EXPECT_EQ(read_hf_config(dir.path.string()).padding_idx, row) << pad;
  }
  for (const json& pad : {json(vocab), json(-vocab - 1), json("3")}) {
    c["pad_token_id"] = pad;
    test::write_text(dir / "config.json", c.dump());
    EXPECT_THROW(read_hf_config(dir.path.string()), UnsupportedInput) << pad;
  }
}

}  // namespace
}  // namespace ptrain
