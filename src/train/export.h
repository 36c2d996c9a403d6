// `ptrain export --merge`: a LoRA checkpoint folded into a full-precision Hugging Face model.
#pragma once
#include <string>

namespace ptrain {

// The checkpoint's adapters merged into its base (W + alpha/r · B·A; an NF4 base is dequantized
// first) as a float32 Hugging Face directory. The base is rebuilt from the checkpoint's config
// (model.hf_path, or the seeded init) and read at its source's precision.
void export_merged(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace ptrain
