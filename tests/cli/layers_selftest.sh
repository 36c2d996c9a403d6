#!/usr/bin/env bash
# layers.sh can fail: on a copy of the tree, each broken include below must make it exit 1
# naming the file, and the unbroken copy must pass.
set -u
root=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
copy() { rm -rf "$tmp/t"; mkdir -p "$tmp/t/docs"; cp "$root/docs/design.md" "$tmp/t/docs/"; cp -r "$root/src" "$root/kernels" "$tmp/t/"; }
expect_fail() {  # expect_fail PATTERN FILE LINE
  local pattern=$1 file=$2 line=$3 out
  copy
  printf '%s\n' "$line" >> "$tmp/t/$file"
  out=$(bash "$here/layers.sh" "$tmp/t" 2>&1)
  if [ $? -eq 1 ] && grep -q -- "$pattern" <<<"$out"; then echo "PASS: $file + '$line' is refused"
  else fail=$((fail+1)); echo "FAIL: $file + '$line' was not refused as '$pattern':"; echo "$out" | tail -3; fi
}
copy
if bash "$here/layers.sh" "$tmp/t" >/dev/null; then echo "PASS: the tree as it is passes"; else fail=$((fail+1)); echo "FAIL: the unbroken copy fails"; fi
expect_fail "kernels/adamw8bit.cu:.*kernels include train" kernels/adamw8bit.cu '#include "train/trainer.h"'
expect_fail "kernels/nf4_dequant.cu:.*not header-only math" kernels/nf4_dequant.cu '#include "quant/nf4.h"'
expect_fail "src/quant/nf4.cpp:.*includes kernels/nf4_dequant_cuda.h, which includes optim" kernels/nf4_dequant_cuda.h '#include "optim/sr_bits.h"'
expect_fail "src/model/llama.cpp:.*model includes train" src/model/llama.cpp '#include "train/step.h"'
expect_fail "src/model/llama.cpp:.*neither a header of src/model/" src/model/llama.cpp '#include "step.h"'
expect_fail "src/quant/nf4.cpp:.*include form" src/quant/nf4.cpp '#include "../train/step.h"'
exit $((fail > 0))
