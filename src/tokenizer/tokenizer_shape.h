// The shape of a tokenizer.json as HF tokenizers (0.23) deserializes it, checked before ptrain
// reads a value from it: every option of the model, of each normalizer / pre-tokenizer / decoder /
// post-processor ptrain implements and of each added token must be one HF reads, of the JSON type
// HF reads, present where HF requires it and null only where HF takes null for its default. An
// option ptrain does not know — a newer HF's, or a typo HF would skip — is refused by name rather
// than ignored, and a file HF refuses (a missing `trim_offsets`, `"invert": "true"`, another
// `version`) is refused too, so that ptrain never reads a file HF cannot.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace ptrain {

// Calls `fail` (which throws) with the first thing in `tokenizer` that is not as HF reads it,
// naming where it is, e.g. `pre_tokenizer.pretokenizers[1] (ByteLevel): 'trim_offsets' is missing`.
// Components of kinds ptrain does not implement are left to the reader, which refuses them by name.
void check_tokenizer_json_shape(const nlohmann::json& tokenizer, const std::function<void(const std::string&)>& fail);

}  // namespace ptrain
