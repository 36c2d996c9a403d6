// Which config file and which tokenizer file of a Hugging Face model directory transformers reads
// (config.json / tokenizer.json, or the versioned file configuration_files / fast_tokenizer_files
// points at). Kept apart from checkpoint/hf.h so that the
// readers built without the model (the tokenizer directory's, the fuzz and sanitizer builds) can
// take it.
#pragma once
#include <string>

namespace ptrain {

// The config file transformers' from_pretrained reads in DIR: config.json, unless config.json lists
// `configuration_files` — then the config.VERSION.json of the last VERSION not above transformers
// 5.23.0, taking the names in transformers' order (sorted as strings, stopping at the first version
// above it). Every reader of a model directory's config goes through it. Throws UnsupportedInput
// for a list transformers fails on or a version ptrain does not compare (only N.N.N releases),
// RuntimeError where the file chosen is missing.
std::string hf_config_file(const std::string& dir);

// The tokenizer file transformers' AutoTokenizer reads in DIR: tokenizer.json, unless
// tokenizer_config.json lists `fast_tokenizer_files` — then the file whose name holds
// "tokenizer.VERSION.json" (searched anywhere in the name, as transformers' regex does) of the
// last VERSION not above 5.23.0, by the same order as hf_config_file. Throws as it does, and
// UnsupportedInput for a name that leads outside DIR (which transformers would follow).
std::string hf_tokenizer_file(const std::string& dir);

}  // namespace ptrain
