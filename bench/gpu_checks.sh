#!/usr/bin/env bash
# The GPU checks of the sharding, precision and QLoRA work in one run, for a machine with one
# CUDA GPU (CI has none, so this is run on demand): the CUDA-vs-CPU kernel tests, kernel
# throughput, and the NCCL path at world size 1 (tokens/s, peak allocated memory, MFU from
# metrics.jsonl) with all-gather prefetch on and off, chat QLoRA padded and packed. Needs a build
# with nvcc (launch/setup.sh).
#
#   bench/gpu_checks.sh [CONFIG] [STEPS]          (defaults: configs/tiny.toml 50)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG="${1:-$ROOT/configs/tiny.toml}"; STEPS="${2:-50}"
BIN="$ROOT/build/ptrain"
OUT="${OUT:-$(mktemp -d)}"
echo "== kernel tests (CUDA against the CPU references)"
ctest --test-dir "$ROOT/build" -R "Cuda" --output-on-failure
echo "== kernel throughput"
"$ROOT/build/ptrain_bench_kernels"
echo "== NCCL at world size 1 ($CONFIG, $STEPS steps)"
for mode in fp32 mixed bf16; do
  for prefetch in true false; do
    run="$OUT/${mode}_prefetch_$prefetch"
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
      "$BIN" --config "$CONFIG" --set training.device=cuda --set parallel.backend=nccl \
      --set precision.mode=$mode --set parallel.prefetch=$prefetch --set training.steps="$STEPS" \
      --set training.log_every=10 --set training.eval_every=0 --set checkpoint.save_final=false \
      --set run.output_dir="$run" > "$run.log" 2>&1
    echo "$mode prefetch=$prefetch rc=$? | $(tail -n 1 "$run/metrics.jsonl" 2>/dev/null)"
  done
done
echo "== chat QLoRA on JSONL, padded and packed (packed rows take SDPA's masked path): peak allocated vs the plan"
for packing in false true; do
  run="$OUT/chat_packing_$packing"
  "$BIN" --config "$ROOT/configs/tiny_chat_qlora.toml" --set training.device=cuda --set data.packing=$packing \
    --set data.micro_batch_size=32 --set data.seq_len=256 --set training.steps=30 --set training.eval_every=0 \
    --set checkpoint.save_final=false --set run.output_dir="$run" > "$run.log" 2>&1
  echo "packing=$packing rc=$? | $(tail -n 1 "$run/metrics.jsonl" 2>/dev/null)"
  "$BIN" check --config "$ROOT/configs/tiny_chat_qlora.toml" --set training.device=cuda --set data.packing=$packing \
    --set data.micro_batch_size=32 --set data.seq_len=256 | grep -E "^  (activations|peak)"
done
echo "== speed race against PyTorch FSDP2 (configs/llama3_2_1b_mixed.toml)"
OUT="$OUT/speed" "$ROOT/bench/speed_vs_fsdp2.sh" "$ROOT/configs/llama3_2_1b_mixed.toml" 30
echo "outputs in $OUT"
