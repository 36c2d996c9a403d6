#!/usr/bin/env bash
# The speed race on one GPU: ptrain and the PyTorch FSDP2 reference (bench/fsdp2_reference.py:
# fully_shard + MixedPrecisionPolicy at world size 1, eager and per-layer torch.compile) train
# the same model, batch, precision mode and activation-checkpointing policy back to back; prints
# tokens/s, TFLOP/s, MFU (one FLOP count — ptrain's 6N + attention — over the GPU's dense bf16
# peak) and peak allocated memory side by side, with ptrain/reference ratios.
#
#   bench/speed_vs_fsdp2.sh [CONFIG] [STEPS] [--set k=v ...]   (defaults: configs/llama3_2_1b_mixed.toml 30)
#   PEAK_TFLOPS=989 overrides the peak (default: looked up from the GPU's name).
# Targets (issue "speed race"): tokens/s >= 1.2x eager and >= 1.0x compiled, memory <= 0.85x.
set -euo pipefail
CONFIG="${1:-$(dirname "$0")/../configs/llama3_2_1b_mixed.toml}"; STEPS="${2:-30}"; shift $(( $# > 2 ? 2 : $# ))
source "$(dirname "$0")/lib.sh"
WARMUP=5
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
read_config "$CONFIG" "$@"
echo "model dim=$DIM layers=$LAYERS heads=$HEADS/$KV ffn=$FFN vocab=$VOCAB tied=$TIED | batch ${BATCH}x${SEQ} | $MODE | activation checkpointing $AC | $STEPS steps (+$WARMUP warmup)"

MASTER_ADDR=127.0.0.1 MASTER_PORT=29519 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
  "$BIN" --config "$CONFIG" "$@" --set training.device=cuda --set training.steps=$((STEPS + WARMUP)) \
  --set training.log_every=1 --set training.token_metrics=false --set training.eval_every=0 --set checkpoint.save_final=false \
  --set checkpoint.every_steps=0 --set run.output_dir="$OUT/ptrain" > "$OUT/ptrain.log" 2>&1 \
  || { tail -20 "$OUT/ptrain.log"; exit 1; }
ref=(--dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV" --ffn "$FFN" --vocab "$VOCAB"
     --rope-theta "$THETA" --batch "$BATCH" --seq "$SEQ" --mode "$MODE" --steps "$STEPS" --warmup "$WARMUP")
[ "$TIED" = true ] && ref+=(--tied)
[ "$AC" = full ] && ref+=(--activation-checkpointing)
"$PY" "$ROOT/bench/fsdp2_reference.py" "${ref[@]}" > "$OUT/eager.json" 2> "$OUT/eager.log" || { tail -20 "$OUT/eager.log"; exit 1; }
"$PY" "$ROOT/bench/fsdp2_reference.py" "${ref[@]}" --compile > "$OUT/compiled.json" 2> "$OUT/compiled.log" \
  || { tail -20 "$OUT/compiled.log"; exit 1; }

"$PY" "$ROOT/bench/speed_table.py" "$OUT" "$WARMUP" "${PEAK_TFLOPS:-}"
echo "logs and metrics in $OUT"
