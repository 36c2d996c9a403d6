#!/usr/bin/env bash
# Every include between the folders of src/ points down the layer order that docs/design.md
# states on its "Layer order:" line (a folder may include itself and the folders to its left).
# Prints each include that runs against the order; exit 1 if there is any.
set -u
src=$1
order=($(grep -m1 '^Layer order:' "$src/docs/design.md" | grep -o '`[a-z]*`' | tr -d '`'))
if [ ${#order[@]} -lt 2 ]; then echo "FAIL: no 'Layer order:' line in docs/design.md"; exit 1; fi
declare -A rank
for i in "${!order[@]}"; do rank[${order[$i]}]=$i; done
bad=0; checked=0
for dir in "$src"/src/*/; do
  from=$(basename "$dir")
  if [ -z "${rank[$from]+x}" ]; then echo "FAIL: src/$from/ is not in the layer order"; bad=$((bad+1)); continue; fi
  while IFS=: read -r file line to; do
    checked=$((checked+1))
    if [ -z "${rank[$to]+x}" ]; then echo "FAIL: ${file#$src/}:$line includes from unknown folder '$to'"; bad=$((bad+1))
    elif [ "${rank[$to]}" -gt "${rank[$from]}" ]; then
      echo "FAIL: ${file#$src/}:$line: $from includes $to, which is above it"; bad=$((bad+1))
    fi
  done < <(grep -Hn -o '^#include "[a-z_]*/' "$dir"*.h "$dir"*.cpp 2>/dev/null | sed -E 's/#include "([a-z_]*)\//\1/')
done
echo "layers: ${order[*]}; $checked includes of src/ headers checked, $bad against the order"
[ $bad -eq 0 ]
