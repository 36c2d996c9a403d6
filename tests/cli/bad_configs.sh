#!/usr/bin/env bash
# Every config in tests/configs/bad/ makes the real binary exit 2, before anything starts
# (a JSONL file's content is found bad when `check` reads the dataset),
# with `error: FILE:LINE: KEY:` for the key named in the file's "# expect: KEY LINE" header.
set -u
bin=$1; dir=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
head -c 20000 /dev/zero | tr '\0' 'a' > "$tmp/corpus.txt"
# The JSONL datasets and tokenizers the data.* cases name (relative to the config).
ln -s "$(cd "$dir" && pwd)/data" "$tmp/data"
has_gpu=0; command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && has_gpu=1
pass=0; fail=0; skipped=0
for f in "$dir"/*.toml; do
  read -r _ _ key line < "$f"
  if grep -q '^# requires: no-gpu' "$f" && [ $has_gpu = 1 ]; then
    echo "SKIP $(basename "$f"): needs a machine without a GPU"; skipped=$((skipped+1)); continue
  fi
  sets=(); grep -qE '^path *=' "$f" || sets=(--set data.path=corpus.txt)
  cp "$f" "$tmp/bad.toml"
  out=$(cd "$tmp" && "$bin" check --config bad.toml "${sets[@]}" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q "^error: bad.toml:$line: $key:" <<<"$out"; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL $(basename "$f"): rc=$rc, wanted 'error: bad.toml:$line: $key:'"; echo "$out" | head -5
  fi
done
echo "bad configs: $pass rejected correctly, $fail wrong, $skipped skipped"
[ $fail -eq 0 ] && [ $pass -ge 25 ]
