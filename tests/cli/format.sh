#!/usr/bin/env bash
# The C++ and CUDA sources are formatted as .clang-format says (clang-format from Debian, which
# launch/setup.sh installs). Prints the first differences and exits 1 when a file drifts; fix
# with: clang-format -i $(git ls-files '*.h' '*.cpp' '*.cu')
set -u
root=$1
command -v clang-format >/dev/null || { echo "FAIL: clang-format is not installed (launch/setup.sh installs it)"; exit 1; }
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu')
else
  mapfile -t files < <(find src kernels tests bench -name '*.h' -o -name '*.cpp' -o -name '*.cu')
fi
out=$(clang-format --dry-run -Werror "${files[@]}" 2>&1)
rc=$?
echo "$out" | head -20
echo "clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1): ${#files[@]} files checked, $(grep -c 'error:' <<<"$out") differences"
exit $rc
