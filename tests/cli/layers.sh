#!/usr/bin/env bash
# Every include between the folders of src/ points down the layer order that docs/design.md
# states on its "Layer order:" line (a folder may include itself and the folders to its left),
# whatever its form:
#   "dir/x.h"  a header of src/dir/, checked against the order;
#   "x.h"      (no folder) must be a header of the includer's own folder, or — from src/ — one of
#              kernels/'s launcher headers (declarations the CPU code calls);
#   anything else in quotes ("../x.h", "a/b/c.h", unknown folders) is refused.
# kernels/ (CUDA) may include its own headers and the header-only math of the folders up to
# `optim` (a header with no .cpp beside it: the code the kernels must match bit for bit). A src/
# file that includes a kernels/ launcher header must sit at or above every folder that header
# includes, so no path through kernels/ leads upwards.
# Prints each include that breaks these rules; exit 1 if there is any.
set -u
root=$1
order=($(grep -m1 '^Layer order:' "$root/docs/design.md" | grep -o '`[a-z]*`' | tr -d '`'))
if [ ${#order[@]} -lt 2 ]; then echo "FAIL: no 'Layer order:' line in docs/design.md"; exit 1; fi
declare -A rank
for i in "${!order[@]}"; do rank[${order[$i]}]=$i; done
kernel_top=${rank[optim]}  # kernels may reach header-only math up to this layer
bad=0; checked=0
fail() { echo "FAIL: $*"; bad=$((bad+1)); }

# Quoted includes of `files` as "file:line:target" lines.
includes() { grep -Hn -o '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*"' "$@" 2>/dev/null | sed -E 's/#[[:space:]]*include[[:space:]]*"([^"]*)"/\1/; s/:[[:space:]]+/:/'; }

declare -A kmax  # kernels/ header -> the highest layer it includes
for file in "$root"/kernels/*; do
  case "$file" in *.cu|*.cuh|*.h) ;; *) continue ;; esac
  while IFS=: read -r f line target; do
    checked=$((checked+1)); where="${f#$root/}:$line"
    if [[ "$target" =~ ^([a-z_]+)/([A-Za-z0-9_]+)\.h$ ]]; then
      to=${BASH_REMATCH[1]}; stem=${BASH_REMATCH[2]}
      if [ -z "${rank[$to]+x}" ]; then fail "$where includes \"$target\" from unknown folder '$to'"
      elif [ "${rank[$to]}" -gt "$kernel_top" ]; then fail "$where: kernels include $to, which is above optim"
      elif [ -f "$root/src/$to/$stem.cpp" ]; then fail "$where includes \"$target\", which is not header-only math"
      elif [ ! -f "$root/src/$target" ]; then fail "$where includes \"$target\", which does not exist"
      elif [[ "$file" == *.h ]]; then
        name=$(basename "$file"); [ "${rank[$to]}" -gt "${kmax[$name]:--1}" ] && kmax[$name]=${rank[$to]}
      fi
    elif [[ "$target" =~ ^[A-Za-z0-9_]+\.(h|cuh)$ ]]; then
      [ -f "$root/kernels/$target" ] || fail "$where includes \"$target\", not a kernels/ header"
    else
      fail "$where: include form \"$target\""
    fi
  done < <(includes "$file")
done
for dir in "$root"/src/*/; do
  from=$(basename "$dir")
  if [ -z "${rank[$from]+x}" ]; then fail "src/$from/ is not in the layer order"; continue; fi
  while IFS=: read -r file line target; do
    checked=$((checked+1)); where="${file#$root/}:$line"
    if [[ "$target" =~ ^([a-z_]+)/[A-Za-z0-9_]+\.h$ ]]; then
      to=${BASH_REMATCH[1]}
      if [ -z "${rank[$to]+x}" ]; then fail "$where includes \"$target\" from unknown folder '$to'"
      elif [ "${rank[$to]}" -gt "${rank[$from]}" ]; then fail "$where: $from includes $to, which is above it"
      elif [ ! -f "$root/src/$target" ]; then fail "$where includes \"$target\", which does not exist"; fi
    elif [[ "$target" =~ ^[A-Za-z0-9_]+\.h$ ]]; then
      if [ -f "$dir$target" ]; then :
      elif [ ! -f "$root/kernels/$target" ]; then
        fail "$where includes \"$target\", neither a header of src/$from/ nor a kernels/ launcher header"
      elif [ "${kmax[$target]:--1}" -gt "${rank[$from]}" ]; then
        fail "$where: $from includes kernels/$target, which includes ${order[${kmax[$target]}]}, above $from"
      fi
    else
      fail "$where: include form \"$target\" (use \"folder/header.h\" for src/ headers)"
    fi
  done < <(includes "$dir"*.h "$dir"*.cpp)
done

echo "layers: ${order[*]} (kernels/ up to optim); $checked includes of src/ and kernels/ checked, $bad against the rules"
[ $bad -eq 0 ]
