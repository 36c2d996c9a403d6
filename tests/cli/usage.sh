#!/usr/bin/env bash
# Exit codes and messages of the command line: 0 success, 2 usage/config errors, 1 runtime
# failures, each with a message naming the problem.
set -u
bin=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; pass=0
expect() {  # expect RC PATTERN -- command...
  local want=$1 pattern=$2; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq "$want" ] && grep -qE -- "$pattern" <<<"$out"; then pass=$((pass+1)); else
    fail=$((fail+1)); echo "FAIL: $* -> rc=$rc (want $want), output:"; echo "$out" | head -5; fi
}
head -c 30000 /dev/urandom | base64 > "$tmp/corpus.txt"
cat > "$tmp/ok.toml" <<TOML
[run]
output_dir = "$tmp/run"
[model]
dim = 32
n_layers = 1
n_heads = 2
n_kv_heads = 1
ffn_dim = 64
[data]
path = "$tmp/corpus.txt"
seq_len = 16
micro_batch_size = 2
[training]
steps = 2
device = "cpu"
TOML

expect 0 "usage:" -- "$bin" --help
expect 0 "^ptrain [0-9]" -- "$bin" --version
expect 2 "usage:" -- "$bin"
expect 2 "unknown command 'trian'" -- "$bin" trian --config "$tmp/ok.toml"
expect 2 "needs --config" -- "$bin" check
expect 2 "unknown argument '--confg'" -- "$bin" --confg x.toml
expect 2 "no such config file" -- "$bin" check --config "$tmp/missing.toml"
expect 2 "world-size must be an integer" -- "$bin" check --config "$tmp/ok.toml" --world-size 0
expect 0 "\"total_state_bytes\"" -- "$bin" check --config "$tmp/ok.toml" --json
expect 0 "bytes/param" -- "$bin" check --config "$tmp/ok.toml"
# A corrupt token file is a config problem (the data file is checked before anything starts).
printf 'PTRAINTK\1\0\0\0\2\0\0\0' > "$tmp/bad.bin"
expect 2 "data.path: token file .* shorter than its 32-byte header" -- "$bin" check --config "$tmp/ok.toml" --set data.path="$tmp/bad.bin" --set data.format=tokens
# Runtime failures: exit 1 with what failed.
expect 1 "not a complete checkpoint" -- "$bin" eval --config "$tmp/ok.toml" --checkpoint "$tmp/nowhere"
mkdir -p "$tmp/ck/step_1"; echo '{"format_version": 1' > "$tmp/ck/step_1/meta.json"
expect 1 "meta.json is corrupt" -- "$bin" export --checkpoint "$tmp/ck/step_1" --out "$tmp/x"
# tokenize -> eval on the token file gives the same numbers as eval on the text.
expect 0 "byte-level tokens" -- "$bin" tokenize --in "$tmp/corpus.txt" --out "$tmp/corpus.bin"
a=$("$bin" eval --config "$tmp/ok.toml" --data "$tmp/corpus.txt" --json 2>/dev/null | sed 's/"data":"[^"]*",//')
b=$("$bin" eval --config "$tmp/ok.toml" --data "$tmp/corpus.bin" --json 2>/dev/null | sed 's/"data":"[^"]*",//')
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: eval text vs tokens: '$a' vs '$b'"; fi
echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
