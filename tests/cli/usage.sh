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
expect 2 "unknown command 'trian'; did you mean train\?" -- "$bin" trian --config "$tmp/ok.toml"
for cmd in train check eval compare export generate tokenize; do  # every subcommand's own help, its flags listed
  expect 0 "^usage: ptrain $cmd .*--" -- "$bin" $cmd --help
  expect 0 "^  --help" -- "$bin" $cmd -h
done
expect 2 "did you mean --config\?" -- "$bin" check --confg "$tmp/ok.toml"
expect 2 "did you mean --checkpoint\?" -- "$bin" export --chekpoint x --out y
expect 2 "ptrain export does not take --world-size" -- "$bin" export --world-size 2 --checkpoint x --out y
expect 2 "--gguf-type and --config go with --gguf FILE" -- "$bin" export --config "$tmp/ok.toml" --checkpoint x --out y
expect 2 "choose f32, f16, bf16 or q8_0" -- "$bin" export --gguf "$tmp/x.gguf" --gguf-type q4 --checkpoint x
expect 2 "takes --checkpoint DIR .* or --config FILE" -- "$bin" export --gguf "$tmp/x.gguf"
expect 2 "--merge takes no value" -- "$bin" export --checkpoint x --out y --merge=yes
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
# JSONL datasets: check reports them, eval scores their trained tokens, tokenize refuses the
# records whose loss mask a token file would lose.
for i in $(seq 40); do
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"What is $i + $i?\"}, {\"role\": \"assistant\", \"content\": \"$i + $i = $((i+i)).\"}]}"
done > "$tmp/chats.jsonl"
chat=(--config "$src/configs/tiny_chat_qlora.toml" --set model.hf_path="$src/tests/fixtures/hf_chat" --set data.path="$tmp/chats.jsonl" --set training.device=cpu)
expect 0 "samples: 40 \(train 38, validation 2\).*trained on" -- bash -c "'$bin' check ${chat[*]} 2>&1 | tr '\\n' ' '"
expect 0 "packing: [0-9]+ training rows of 256 per epoch, [0-9.]+% filled" -- "$bin" check "${chat[@]}"
expect 0 "trained tokens in [0-9]+ rows of 256" -- "$bin" eval "${chat[@]}" --data "$tmp/chats.jsonl"
# KTO: a file mixing paired and unpaired records is refused naming both kinds (TRL reads one a dataset)
{ echo '{"prompt": "Q:", "completion": " a", "label": true}'
  echo '{"prompt": "Q:", "chosen": " a", "rejected": " b"}'; } > "$tmp/kto_mixed.jsonl"
expect 2 "mixes paired records .* with unpaired ones" -- "$bin" check --config "$src/configs/tiny_dpo_qlora.toml" \
  --set model.hf_path="$src/tests/fixtures/hf_chat" --set training.objective=kto --set preference.loss_type=kto \
  --set data.path="$tmp/kto_mixed.jsonl" \
  --set data.cache=false --set training.device=cpu
expect 1 "chats.jsonl:1: a chat or prompt/completion record has a loss mask" -- "$bin" tokenize --tokenizer "$src/tests/fixtures/hf_chat" --in "$tmp/chats.jsonl" --out "$tmp/chats.bin"
# The model directory's chat template decides how chats render: Llama 3.1's (dated system
# header) is recognized, in tokenizer_config.json or chat_template.jinja; a template ptrain does
# not know is refused (exit 2) unless data.chat_template names one.
cp -r "$src/tests/fixtures/hf_chat" "$tmp/hf_chat31"; rm -f "$tmp/hf_chat31/chat_template.jinja"  # the template moves to tokenizer_config.json
cp "$src/tests/fixtures/chat_templates/llama3.1/tokenizer_config.json" "$tmp/hf_chat31/tokenizer_config.json"
expect 0 "chats as llama3.1 renders them" -- "$bin" check "${chat[@]}" --set model.hf_path="$tmp/hf_chat31"
printf '%s' '{{ "<start_of_turn>" }}' > "$tmp/hf_chat31/chat_template.jinja"; echo '{}' > "$tmp/hf_chat31/tokenizer_config.json"
expect 2 "chat_template.jinja: the chat template is not one ptrain renders; closest: line 1: the literal \"<start_of_turn>\" is not in .*data.chat_template" -- "$bin" check "${chat[@]}" --set model.hf_path="$tmp/hf_chat31"
expect 0 "chats as llama3 renders them \(data.chat_template\)" -- "$bin" check "${chat[@]}" --set model.hf_path="$tmp/hf_chat31" --set data.chat_template=llama3
# A model directory's tokenizer is read as transformers reads it: the log says which class and why;
# a tokenizer_config.json key ptrain does not reproduce is a config error naming file and key.
expect 0 "tokenizer .*hf_chat31/tokenizer.json: TokenizersBackend \(no tokenizer_class\)" -- "$bin" check "${chat[@]}" --set model.hf_path="$tmp/hf_chat31" --set data.chat_template=llama3
echo '{"split_special_tokens": true}' > "$tmp/hf_chat31/tokenizer_config.json"
expect 2 "data.tokenizer: .*hf_chat31/tokenizer_config.json: split_special_tokens: = true: transformers then reads special tokens written in text as plain text" -- "$bin" check "${chat[@]}" --set model.hf_path="$tmp/hf_chat31" --set data.chat_template=llama3
# Resuming on other data is said, not silent: the checkpoint keeps the rows' fingerprint.
expect 0 "" -- "$bin" "${chat[@]}" --set training.steps=2 --set training.eval_every=0 --set run.output_dir="$tmp/chatrun"
expect 0 "\"data\": \"samples:[0-9a-f]{16}\"" -- cat "$tmp/chatrun/checkpoints/step_2/meta.json"
expect 0 "the data differs from the checkpoint's" -- "$bin" "${chat[@]}" --set training.steps=3 --set training.eval_every=0 --set run.output_dir="$tmp/chatrun" --set checkpoint.resume=auto --set data.packing=false
expect 2 "data.path: no such file 'data/chats.jsonl'" -- "$bin" check --config "$src/configs/llama3_8b_qlora.toml"
# An export carries the model directory's tokenizer files transformers reads, named templates too.
cp -r "$src/tests/fixtures/hf_chat" "$tmp/hf_chat_named"; mkdir "$tmp/hf_chat_named/additional_chat_templates"
printf '%s' "{{ 'tool use' }}" > "$tmp/hf_chat_named/additional_chat_templates/tool_use.jinja"
expect 0 "" -- "$bin" "${chat[@]}" --set model.hf_path="$tmp/hf_chat_named" --set training.steps=1 --set training.eval_every=0 --set run.output_dir="$tmp/namedrun"
expect 0 "copied the tokenizer of .*hf_chat_named beside it" -- "$bin" export --checkpoint "$tmp/namedrun/checkpoints/step_1" --out "$tmp/named_export"
expect 0 "tool use" -- cat "$tmp/named_export/additional_chat_templates/tool_use.jinja"
# generate: what to answer, the sampling settings, a tokenizer for text, room for the prompt.
gen=(generate "${chat[@]}" --max-new-tokens 4)
expect 2 "what to answer: --prompt TEXT, --chat" -- "$bin" "${gen[@]}"
expect 2 "--in needs --out" -- "$bin" "${gen[@]}" --in "$tmp/chats.jsonl"
expect 2 "--prompt and --in: give one or the other" -- "$bin" "${gen[@]}" --prompt hi --in "$tmp/chats.jsonl" --out "$tmp/a.jsonl"
expect 2 "--temperature must be >= 0" -- "$bin" "${gen[@]}" --prompt hi --temperature -1
expect 2 "--temperature must be a number" -- "$bin" "${gen[@]}" --prompt hi --temperature warm
expect 2 "--top-p must be in \(0, 1\]" -- "$bin" "${gen[@]}" --prompt hi --temperature 1 --top-p 1.5
expect 2 "give a --temperature > 0 with them" -- "$bin" "${gen[@]}" --prompt hi --top-k 5
expect 2 "--max-new-tokens must be an integer >= 1" -- "$bin" "${gen[@]}" --prompt hi --max-new-tokens 0
expect 2 "the prompt has [0-9]+ tokens; the model has 256 positions" -- "$bin" "${gen[@]}" --prompt "$(head -c 3000 "$tmp/corpus.txt")"
expect 2 "text prompts need the model's tokenizer: no --tokenizer, data.tokenizer or model.hf_path" -- "$bin" generate --config "$tmp/ok.toml" --prompt hi
expect 2 "text prompts need the model's tokenizer: .*no tokenizer file" -- "$bin" generate --config "$tmp/ok.toml" --prompt hi --tokenizer "$tmp"
echo '{"ids": [1, 2, 3]}' > "$tmp/ids.jsonl"; echo '{"prompt": 7}' > "$tmp/bad_prompt.jsonl"
expect 0 "wrote 1 answers" -- "$bin" generate --config "$tmp/ok.toml" --in "$tmp/ids.jsonl" --out "$tmp/ids_out.jsonl" --max-new-tokens 3
expect 0 "\"ids\":\[[0-9]+,[0-9]+,[0-9]+\]" -- cat "$tmp/ids_out.jsonl"
expect 0 "\"finish\":\"length\"" -- cat "$tmp/ids_out.jsonl"
expect 2 "bad_prompt.jsonl:1: a record needs \"prompt\" \(text\), \"messages\" \(a chat\) or \"ids\"" -- "$bin" "${gen[@]}" --in "$tmp/bad_prompt.jsonl" --out "$tmp/b.jsonl"
expect 1 "not a complete checkpoint" -- "$bin" "${gen[@]}" --prompt hi --checkpoint "$tmp/nowhere"
echo '{"ids": [1, 5000]}' > "$tmp/big_id.jsonl"
expect 2 "big_id.jsonl:1: \"ids\" must be token ids in \[0, 1006\)" -- "$bin" "${gen[@]}" --in "$tmp/big_id.jsonl" --out "$tmp/d.jsonl"
echo '{"prompt": "hi", "ids": [1]}' > "$tmp/two_kinds.jsonl"
expect 2 "two_kinds.jsonl:1: a record holds one of \"prompt\", \"messages\" and \"ids\", not several" -- "$bin" "${gen[@]}" --in "$tmp/two_kinds.jsonl" --out "$tmp/c.jsonl"
# a record's tools go into its chat's prompt (generate_parity.py compares them), never left out
echo '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}' > "$tmp/tools.jsonl"
expect 2 "tools.jsonl:1: the chat's tools: ptrain renders tools, tool calls and tool results only with" -- "$bin" "${gen[@]}" --in "$tmp/tools.jsonl" --out "$tmp/e.jsonl"
echo '{"prompt": "hi", "tools": []}' > "$tmp/text_tools.jsonl"
expect 2 "text_tools.jsonl:1: \"tools\" go with a \"messages\" chat" -- "$bin" "${gen[@]}" --in "$tmp/text_tools.jsonl" --out "$tmp/f.jsonl"
cp -r "$src/tests/fixtures/hf_chat" "$tmp/hf_gen"; echo '{"do_sample": true, "temperature": 0.6, "eos_token_id": [2, 1004]}' > "$tmp/hf_gen/generation_config.json"
expect 0 "generation_config.json sets do_sample = true, temperature = 0.6; ptrain generate decodes as its own flags say" -- "$bin" "${gen[@]}" --prompt hi --set model.hf_path="$tmp/hf_gen"
# A damaged generation_config.json, or eos ids that are not the model's tokens: refused by name,
# never passed over for config.json's.
echo '{"eos_token_id": [2, 1004' > "$tmp/hf_gen/generation_config.json"
expect 2 "hf_gen/generation_config.json is not valid JSON" -- "$bin" "${gen[@]}" --prompt hi --set model.hf_path="$tmp/hf_gen"
echo '{"eos_token_id": [2, 99999]}' > "$tmp/hf_gen/generation_config.json"
expect 2 "generation_config.json: eos_token_id \[2,99999\] must be a token id in \[0, 1006\)" -- "$bin" "${gen[@]}" --prompt hi --set model.hf_path="$tmp/hf_gen"
echo '{"eos_token_id": "2"}' > "$tmp/hf_gen/generation_config.json"
expect 2 "eos_token_id \"2\" must be a token id" -- "$bin" "${gen[@]}" --prompt hi --set model.hf_path="$tmp/hf_gen"
echo '{"do_sample": true, "temperature": 0.6, "eos_token_id": [2, 1004]}' > "$tmp/hf_gen/generation_config.json"
expect 0 "stops at ids \[2, 1001, 1004\]" -- "$bin" "${gen[@]}" --prompt hi --set model.hf_path="$tmp/hf_gen"
expect 0 "prompt [0-9]+ tokens in .* new tokens, decoded in .*tokens/s.*KV cache [0-9.]+ KiB" -- "$bin" "${gen[@]}" --chat --prompt "What is 2 + 2?" --system "Be brief."
expect 0 "finished: (eos|stop|length)" -- bash -c "printf 'Hi\nWhat is 3 + 4?\n' | '$bin' ${gen[*]} --chat"
# training.profile_steps: a Chrome trace of the chosen steps whose events include the step's
# matmuls; the start without a count, and steps past the run's end, are refused by key.
expect 0 "profile of steps 2-3 written: .*trace.rank0.json" -- "$bin" --config "$tmp/ok.toml" --set training.steps=4 --set training.profile_steps=2 --set training.profile_start=2 --set run.output_dir="$tmp/prof"
expect 0 "aten::mm" -- python3 -c "import json, sys; print(sorted({e['name'] for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('cat') == 'cpu_op'}))" "$tmp/prof/trace.rank0.json"
# A run resumed past the traced steps says it traces nothing (no trace file is written).
expect 0 "profile_start = 2 but this run starts at step 5 \(resumed\): nothing is traced" -- "$bin" --config "$tmp/ok.toml" --set training.steps=6 --set training.profile_steps=2 --set training.profile_start=2 --set run.output_dir="$tmp/prof" --set checkpoint.resume=auto
expect 2 "training.profile_steps: must be >= 0 \(got -1\)" -- "$bin" check --config "$tmp/ok.toml" --set training.profile_steps=-1
expect 2 "training.profile_start: must be >= 1 \(got 0\)" -- "$bin" check --config "$tmp/ok.toml" --set training.profile_steps=1 --set training.profile_start=0
expect 2 "training.profile_start: applies to training.profile_steps" -- "$bin" check --config "$tmp/ok.toml" --set training.profile_start=2
expect 2 "training.profile_start: steps 2 to 3 are traced but training.steps is 2" -- "$bin" check --config "$tmp/ok.toml" --set training.profile_steps=2 --set training.profile_start=2
# tokenize -> eval on the token file gives the same numbers as eval on the text.
expect 0 "byte-level tokens" -- "$bin" tokenize --in "$tmp/corpus.txt" --out "$tmp/corpus.bin"
# --chunk-kib: out of range refused; a text cut into parts says how many.
expect 2 "--chunk-kib must be an integer >= 1 \(got '0'\)" -- "$bin" tokenize --in "$tmp/corpus.txt" --out "$tmp/c.bin" --tokenizer "$src/tests/fixtures/hf_chat" --chunk-kib 0
expect 2 "--chunk-kib must be at most 1073741824" -- "$bin" tokenize --in "$tmp/corpus.txt" --out "$tmp/c.bin" --tokenizer "$src/tests/fixtures/hf_chat" --chunk-kib 1073741825
expect 0 "the text in [0-9]+ parts" -- "$bin" tokenize --in "$tmp/corpus.txt" --out "$tmp/c.bin" --tokenizer "$src/tests/fixtures/hf_chat" --chunk-kib 1 --threads 2
a=$("$bin" eval --config "$tmp/ok.toml" --data "$tmp/corpus.txt" --json 2>/dev/null | sed 's/"data":"[^"]*",//')
b=$("$bin" eval --config "$tmp/ok.toml" --data "$tmp/corpus.bin" --json 2>/dev/null | sed 's/"data":"[^"]*",//')
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: eval text vs tokens: '$a' vs '$b'"; fi
# check --plan: a config for another machine (missing data file, GPUs) still plans; without
# --plan the missing data file is an error.
expect 0 "persistent state +~6.03" -- "$bin" check --plan --config "$src/configs/llama3_8b_mixed.toml" --set precision.mode=bf16 --set optimizer.name=adamw8bit --world-size 8
# The peak planner: Llama 3 70B bf16 fits 8 x 80 GB with its activations; at 40 GB it exits 2
# naming changes that would fit, each with its predicted peak.
expect 0 "fits: [0-9.]+ of 80 GiB per GPU" -- "$bin" check --plan --config "$src/configs/llama3_70b_bf16.toml" --world-size 8 --gpu-memory 80
expect 0 "activations +[0-9.]+ GiB \(80 blocks" -- "$bin" check --plan --config "$src/configs/llama3_70b_bf16.toml" --world-size 8 --gpu-memory 80
expect 2 "does not fit in --gpu-memory 40 GiB.*all of the valid ones together: [0-9.]+ GiB — fits" -- bash -c "'$bin' check --plan --config '$src/configs/llama3_70b_bf16.toml' --world-size 8 --gpu-memory 40 2>&1 | tr '\\n' ' '; exit \${PIPESTATUS[0]}"
expect 2 "data.path: no such file" -- "$bin" check --config "$src/configs/llama3_8b_mixed.toml"
# Llama 3 70B QLoRA (NF4 base sharded across ranks, block inputs offloaded) fits two 24 GB GPUs;
# on one it exits 2 and names more ranks.
expect 0 "fits: [0-9.]+ of 24 GiB per GPU" -- "$bin" check --plan --config "$src/configs/llama3_70b_qlora.toml" --world-size 2 --gpu-memory 24
# The other families' configs plan as docs/models.md shows, naming their family.
for c in qwen2_5_0_5b_mixed qwen2_5_1_5b_mixed qwen3_0_6b_mixed; do
  expect 0 "fits: [0-9.]+ of 80 GiB per GPU" -- "$bin" check --plan --config "$src/configs/$c.toml" --gpu-memory 80
done
for c in qwen2_5_7b_bf16 qwen3_8b_bf16 mistral_7b_bf16; do
  expect 0 "fits: [0-9.]+ of 80 GiB per GPU" -- "$bin" check --plan --config "$src/configs/$c.toml" --world-size 8 --gpu-memory 80
done
for c in qwen2_5_7b_qlora qwen3_8b_qlora mistral_7b_qlora; do
  expect 0 "fits: [0-9.]+ of 24 GiB per GPU" -- "$bin" check --plan --config "$src/configs/$c.toml" --gpu-memory 24
done
expect 0 "model: qwen3 \(per-head q/k RMSNorm\), 8,190,735,360 parameters" -- "$bin" check --plan --config "$src/configs/qwen3_8b_qlora.toml"
expect 0 "model: qwen2 \(q/k/v biases, tied embedding\), 494,032,768 parameters" -- "$bin" check --plan --config "$src/configs/qwen2_5_0_5b_mixed.toml"
expect 0 "NF4 0.51[0-9]+ B per 4-bit weight, 1/2 on each rank" -- "$bin" check --plan --config "$src/configs/llama3_70b_qlora.toml" --world-size 2
expect 2 "does not fit in --gpu-memory 24 GiB.*--world-size 2: [0-9.]+ GiB — fits" -- bash -c "'$bin' check --plan --config '$src/configs/llama3_70b_qlora.toml' --world-size 1 --gpu-memory 24 2>&1 | tr '\\n' ' '; exit \${PIPESTATUS[0]}"
# configs/tiny_qlora.toml: QLoRA over the fixture's HF model trains on the CPU (loss falls).
( cd "$src" && "$bin" --config configs/tiny_qlora.toml --set training.steps=30 --set training.eval_every=0 \
    --set run.output_dir="$tmp/qlora" >/dev/null 2>&1 )
# ... and its adapters export in PEFT's format.
expect 0 "" -- "$bin" export --checkpoint "$tmp/qlora/checkpoints/step_30" --out "$tmp/qlora_peft"
for f in adapter_config.json adapter_model.safetensors; do
  if [ -s "$tmp/qlora_peft/$f" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: QLoRA export did not write $f"; fi
done
if grep -q '"peft_type": "LORA"' "$tmp/qlora_peft/adapter_config.json" 2>/dev/null; then pass=$((pass+1)); else
  fail=$((fail+1)); echo "FAIL: adapter_config.json is not a PEFT LoRA config"; fi
first=$(grep -m1 '"loss"' "$tmp/qlora/metrics.jsonl" 2>/dev/null | sed 's/.*"loss":\([0-9.]*\).*/\1/')
last=$(grep '"loss"' "$tmp/qlora/metrics.jsonl" 2>/dev/null | tail -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
if [ -n "$first" ] && [ -n "$last" ] && awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a - 0.5)}'; then pass=$((pass+1)); else
  fail=$((fail+1)); echo "FAIL: tiny_qlora did not train: first loss '$first', last '$last'"; fi
# compare: every mode trains from the same init; summary, CSV and plot are written.
expect 2 "unknown mode 'fp8'" -- "$bin" compare --config "$tmp/ok.toml" --modes fp32,fp8
expect 0 "\| bf16-adam8bit \|" -- "$bin" compare --config "$tmp/ok.toml" --modes fp32,mixed,bf16,bf16-sr,bf16-adam8bit --steps 3 --out "$tmp/cmp"
for f in summary.md summary.csv loss.svg fp32/metrics.jsonl bf16-sr/metrics.jsonl bf16-adam8bit/metrics.jsonl; do
  if [ -s "$tmp/cmp/$f" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compare did not write $f"; fi
done
if grep -q "<svg" "$tmp/cmp/loss.svg" && grep -q "^fp32,3,1,.*,0.00," "$tmp/cmp/summary.csv"; then pass=$((pass+1)); else
  fail=$((fail+1)); echo "FAIL: loss.svg is no SVG or fp32's delta is not 0.00"; cat "$tmp/cmp/summary.csv"; fi
# Same init: every mode's step-1 loss agrees with fp32's to bf16 precision.
l1() { grep -o '"step":1,"loss":[0-9.]*' "$tmp/cmp/$1/metrics.jsonl" | cut -d: -f3; }
if awk -v a="$(l1 fp32)" -v b="$(l1 bf16)" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.02) }'; then pass=$((pass+1)); else
  fail=$((fail+1)); echo "FAIL: step-1 losses differ: fp32 $(l1 fp32) vs bf16 $(l1 bf16)"; fi
# --seeds: each mode over run.seed and run.seed + 1 (other inits: other losses), mean and spread
# in the summary, one runs.csv row per run; a second call trains nothing that finished.
expect 2 "--seeds" -- "$bin" compare --config "$tmp/ok.toml" --modes fp32 --seeds 0
expect 0 "beyond spread" -- "$bin" compare --config "$tmp/ok.toml" --modes fp32,bf16-kahan --steps 3 --seeds 2 --out "$tmp/cmp2"
for f in fp32/seed1234 fp32/seed1235 bf16-kahan/seed1234 bf16-kahan/seed1235; do
  if [ -s "$tmp/cmp2/$f/metrics.jsonl" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compare --seeds did not write $f"; fi
done
s1() { grep -o '"step":1,"loss":[0-9.]*' "$tmp/cmp2/fp32/$1/metrics.jsonl" | cut -d: -f3; }
if [ "$(grep -c '' "$tmp/cmp2/runs.csv")" = 5 ] && [ -n "$(s1 seed1234)" ] && [ "$(s1 seed1234)" != "$(s1 seed1235)" ] &&
   grep -q "updates_lost" "$tmp/cmp2/fp32/seed1234/metrics.jsonl" && grep -q "± " "$tmp/cmp2/summary.md"; then
  pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compare --seeds: runs.csv / seeds / lost-update counts"; cat "$tmp/cmp2/runs.csv"; fi
cp "$tmp/cmp2/fp32/seed1235/metrics.jsonl" "$tmp/seed1235.before"
out=$("$bin" compare --config "$tmp/ok.toml" --modes fp32,bf16-kahan --steps 3 --seeds 2 --out "$tmp/cmp2" 2>&1)
if [ "$(grep -c "already finished" <<<"$out")" = 4 ] && cmp -s "$tmp/seed1235.before" "$tmp/cmp2/fp32/seed1235/metrics.jsonl"; then
  pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: compare ran finished runs again"; echo "$out" | head -5; fi
echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
