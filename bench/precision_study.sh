#!/usr/bin/env bash
# The precision study of docs/results/precision_study.md: `ptrain compare` of every precision
# mode over 3 seeds at a high and a low learning rate (configs/precision_study.toml, cosine decay
# to a tenth), then the summaries and plots copied to docs/results/precision_study/. An
# interrupted study continues where it stopped: compare skips the runs already finished.
#
#   bench/precision_study.sh [OUT]      (default runs/precision_study; about two hours on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${PTRAIN_BUILD:-$ROOT/build}/ptrain"
OUT="${1:-$ROOT/runs/precision_study}"
MODES=fp32,mixed,bf16,bf16-sr,bf16-kahan,bf16-adam8bit
RESULTS="$ROOT/docs/results/precision_study"
mkdir -p "$RESULTS"
cd "$ROOT"
for lr in 3e-3 1e-4; do
  "$BIN" compare --config configs/precision_study.toml --seeds 3 --modes "$MODES" --set optimizer.lr="$lr" \
    --out "$OUT/lr$lr"
  cp "$OUT/lr$lr/summary.md" "$RESULTS/summary_lr$lr.md"
  cp "$OUT/lr$lr/summary.csv" "$RESULTS/summary_lr$lr.csv"
  cp "$OUT/lr$lr/runs.csv" "$RESULTS/runs_lr$lr.csv"
  [ -s "$OUT/lr$lr/loss.svg" ] && cp "$OUT/lr$lr/loss.svg" "$RESULTS/loss_lr$lr.svg"
done
echo "study outputs in $OUT; summaries and plots in $RESULTS (commit $(git rev-parse --short HEAD))"
