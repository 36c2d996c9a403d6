#!/usr/bin/env bash
# README's "## Layout" block lists exactly the folders that exist: every top-level folder of
# the repository and every folder of src/, each once, and nothing that is gone; src/ folders
# in the layer order of docs/design.md.
set -u
src=$1
listed=$(sed -n '/^## Layout/,/^## /p' "$src/README.md" | sed -n '/^```$/,/^```$/p' | grep -oE '^[.a-z_/]+/' | sed 's#/$##')
actual=$( (cd "$src" && git ls-files 2>/dev/null || find . -type f | sed 's#^\./##') | grep '/' | cut -d/ -f1 | grep -v '^src$' | sort -u
          ls -d "$src"/src/*/ | sed "s#^$src/##; s#/\$##")
fail=0
for d in $actual; do grep -qx "$d" <<<"$listed" || { echo "FAIL: $d/ exists but README's layout does not list it"; fail=1; }; done
for d in $listed; do grep -qx "$d" <<<"$actual" || { echo "FAIL: README's layout lists $d/, which does not exist"; fail=1; }; done
order=$(grep -m1 '^Layer order:' "$src/docs/design.md" | grep -o '`[a-z]*`' | tr -d '`' | sed 's#^#src/#')
if [ "$(grep '^src/' <<<"$listed")" != "$order" ]; then echo "FAIL: README lists src/ folders in another order than docs/design.md's layer order"; fail=1; fi
echo "layout: $(wc -w <<<"$listed") folders listed, $(wc -w <<<"$actual") in the tree"
exit $fail
