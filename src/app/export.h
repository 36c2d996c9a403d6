// `ptrain export`: a checkpoint as a Hugging Face model directory of its family, a LoRA
// checkpoint's adapters in PEFT's format, or (--merge) folded into a full-precision model.
#pragma once
#include <string>

namespace ptrain {

// The checkpoint's adapters merged into its base (W + alpha/r · B·A; an NF4 base is dequantized
// first) as a float32 Hugging Face directory. The base is rebuilt from the checkpoint's config
// (model.hf_path, or the seeded init) and read at its source's precision.
void export_merged(const std::string& checkpoint_dir, const std::string& out_dir);

// The subcommand: export_merged with `merge`, else checkpoint/checkpoint.h's export_hf. Returns
// the exit code.
int run_export(const std::string& checkpoint_dir, const std::string& out_dir, bool merge);

}  // namespace ptrain
