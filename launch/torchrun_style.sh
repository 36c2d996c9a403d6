#!/usr/bin/env bash
# torchrun-style launch on one node without MPI (CUDA/NCCL only): one process per GPU with
# RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, as torchrun would set them.
#   NGPU=8 launch/torchrun_style.sh configs/llama3_8b_mixed.toml
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG=${1:?usage: NGPU=8 $0 CONFIG [--set k=v ...]}; shift
N=${NGPU:-8}
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1} MASTER_PORT=${MASTER_PORT:-29500} WORLD_SIZE=$N
pids=()
for ((r = 0; r < N; r++)); do
  RANK=$r LOCAL_RANK=$r "$ROOT/build/ptrain" --config "$CONFIG" "$@" &
  pids+=($!)
done
# If any rank fails, stop the others instead of leaving them waiting in a collective.
status=0
for p in "${pids[@]}"; do
  if ! wait "$p"; then status=1; kill "${pids[@]}" 2>/dev/null || true; fi
done
exit $status
