#!/usr/bin/env bash
# Benchmark: ptrain training step vs a PyTorch eager reference step (transformers
# LlamaForCausalLM + torch.optim.AdamW) of the same model and batch on the CPU.
# Runs each side several times (interleaved) and prints the median step times and the ratio
# ptrain / reference (goal: <= 0.9), against the reference with torch's default AdamW (what
# `torch.optim.AdamW(params)` runs on CPU: the per-tensor loop) and with AdamW(fused=True).
#
#   bench/step_vs_pytorch.sh [CONFIG] [REPEATS] [STEPS]     (defaults: configs/tiny.toml 3 20)
set -euo pipefail
CONFIG="${1:-$(dirname "$0")/../configs/tiny.toml}"; REPEATS="${2:-3}"; STEPS="${3:-20}"
source "$(dirname "$0")/lib.sh"
THREADS=$(nproc)
WARMUP=3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

read_config "$CONFIG"
echo "model dim=$DIM layers=$LAYERS heads=$HEADS/$KV ffn=$FFN vocab=$VOCAB | batch ${BATCH}x${SEQ} fp32 | $THREADS threads | $REPEATS repeats x $STEPS steps (+$WARMUP warmup)"

ptrain_run() {
  rm -rf "$tmp/run"
  "$BIN" --config "$CONFIG" --set training.steps=$((STEPS + WARMUP)) --set training.log_every=1 --set training.token_metrics=false \
    --set training.eval_every=0 --set checkpoint.save_final=false --set run.output_dir="$tmp/run" \
    --set training.threads=$THREADS --set precision.mode=fp32 >/dev/null 2>&1
  "$PY" - "$tmp/run/metrics.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print(statistics.median(r["step_time_s"] for r in rows if r["step"] > int(sys.argv[2])))
PY
}
ref_run() {
  "$PY" "$ROOT/bench/reference_step.py" --dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV" \
    --ffn "$FFN" --vocab "$VOCAB" --rope-theta "$THETA" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" \
    --warmup "$WARMUP" --threads "$THREADS" "$@" 2>/dev/null | "$PY" -c "import json,sys; print(json.load(sys.stdin)['median_step_s'])"
}
p=(); r=(); f=()
for i in $(seq "$REPEATS"); do
  p+=("$(ptrain_run)"); r+=("$(ref_run)"); f+=("$(ref_run --fused-adamw)")
  printf 'repeat %d: ptrain %.4f s/step | pytorch %.4f s/step | pytorch fused AdamW %.4f s/step\n' \
    "$i" "${p[-1]}" "${r[-1]}" "${f[-1]}"
done
"$PY" - "${p[*]}" "${r[*]}" "${f[*]}" <<'PY'
import statistics, sys
p, r, f = (statistics.median(map(float, a.split())) for a in sys.argv[1:4])
print(f"median step time: ptrain {p:.4f} s | pytorch eager {r:.4f} s | pytorch eager, fused AdamW {f:.4f} s")
print(f"ratio ptrain/pytorch = {p / r:.3f} (goal <= 0.9) | ratio vs fused-AdamW reference = {p / f:.3f}")
PY
