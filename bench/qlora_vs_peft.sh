#!/usr/bin/env bash
# The QLoRA race on one GPU: ptrain and PEFT + bitsandbytes (bench/qlora_peft_reference.py: a
# transformers Llama whose block projections are bitsandbytes NF4 Linear4bit, PEFT LoRA on the
# same projections) train the same shape, batch, rank, alpha, dropout, double quantization and
# activation-checkpointing policy back to back on random data; prints tokens/s and peak allocated
# memory side by side with ptrain/reference ratios (bench/speed_table.py).
#
#   bench/qlora_vs_peft.sh [CONFIG] [STEPS] [--set k=v ...]   (defaults: configs/llama3_8b_qlora.toml 10)
#   PEFT_PREPARE=1 also races PEFT after prepare_model_for_kbit_training (float32 norms, embeddings
#   and output layer, as the QLoRA recipes run it).
# The reference needs bitsandbytes, transformers and peft importable by the venv's python (on the
# GPU machine: bitsandbytes from the bundle's py/site, on PYTHONPATH).
# Targets (issue "GPU speed, round 2"): tokens/s >= 1.5x PEFT + bitsandbytes at <= 0.8x its memory.
set -euo pipefail
CONFIG="${1:-$(dirname "$0")/../configs/llama3_8b_qlora.toml}"; STEPS="${2:-10}"; shift $(( $# > 2 ? 2 : $# ))
source "$(dirname "$0")/lib.sh"
WARMUP=3
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
# Random-ish text in token rows, one optimizer step per micro-batch: the speed of the step, not of
# the dataset (the configs' own data paths point at the user's files).
DATA=(--set data.path="$ROOT/data/fortunes.txt" --set data.format=text --set data.packing=false
      --set training.grad_accum_steps=1 --set training.device=cuda)
read_config "$CONFIG" "${DATA[@]}" "$@"
[ "$LORA" = true ] && [ "$QUANT" = nf4 ] || { echo "qlora_vs_peft: $CONFIG is not a QLoRA config (lora.enabled, quant.base = nf4)" >&2; exit 2; }
echo "model dim=$DIM layers=$LAYERS heads=$HEADS/$KV ffn=$FFN vocab=$VOCAB tied=$TIED | NF4 (double quant $DOUBLE_QUANT) + LoRA r=$LORA_RANK alpha=$LORA_ALPHA dropout=$LORA_DROPOUT on $LORA_TARGETS | batch ${BATCH}x${SEQ} | $MODE | activation checkpointing $AC | $STEPS steps (+$WARMUP warmup)"

"$BIN" --config "$CONFIG" "${DATA[@]}" "$@" --set training.steps=$((STEPS + WARMUP)) \
  --set training.log_every=1 --set training.token_metrics=false --set training.eval_every=0 --set checkpoint.save_final=false \
  --set checkpoint.every_steps=0 --set run.output_dir="$OUT/ptrain" > "$OUT/ptrain.log" 2>&1 \
  || { tail -20 "$OUT/ptrain.log"; exit 1; }
ref=(--dim "$DIM" --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV" --ffn "$FFN" --vocab "$VOCAB"
     --rope-theta "$THETA" --batch "$BATCH" --seq "$SEQ" --rank "$LORA_RANK" --alpha "$LORA_ALPHA"
     --dropout "$LORA_DROPOUT" --targets "$LORA_TARGETS" --steps "$STEPS" --warmup "$WARMUP")
[ "$TIED" = true ] && ref+=(--tied)
[ "$DOUBLE_QUANT" = true ] && ref+=(--double-quant)
[ "$AC" = full ] && ref+=(--activation-checkpointing)
"$PY" "$ROOT/bench/qlora_peft_reference.py" "${ref[@]}" > "$OUT/peft.json" 2> "$OUT/peft.log" || { tail -20 "$OUT/peft.log"; exit 1; }
if [ "${PEFT_PREPARE:-0}" = 1 ]; then
  "$PY" "$ROOT/bench/qlora_peft_reference.py" "${ref[@]}" --prepare > "$OUT/peft_prepare.json" 2> "$OUT/peft_prepare.log" \
    || { tail -20 "$OUT/peft_prepare.log"; exit 1; }
fi
"$PY" -c 'import json, sys; print("reference versions:", json.load(open(sys.argv[1]))["versions"])' "$OUT/peft.json"
"$PY" "$ROOT/bench/speed_table.py" "$OUT" "$WARMUP" "${PEAK_TFLOPS:-}"
echo "(MFU counts 6N + attention FLOPs per token for every row, a full fine-tune's count: LoRA skips the"
echo " base's weight gradients and checkpointing recomputes the forward, so it is a yardstick, not work done)"
echo "logs and metrics in $OUT"
