#!/usr/bin/env bash
# Several nodes with mpirun and a hostfile ("node1 slots=8" per line). The checkout, the
# build and run.output_dir must be on a filesystem every node sees (checkpoints are written
# by all ranks into one directory).
#   HOSTFILE=hosts.txt PER_NODE=8 NODES=2 launch/mpirun_multi_node.sh configs/llama3_70b_bf16.toml
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG=${1:?usage: HOSTFILE=hosts PER_NODE=8 NODES=2 $0 CONFIG [--set k=v ...]}; shift
PER_NODE=${PER_NODE:-8}; NODES=${NODES:?set NODES}
exec mpirun --hostfile "${HOSTFILE:?set HOSTFILE}" -np $((PER_NODE * NODES)) --map-by "ppr:${PER_NODE}:node" \
  --bind-to none -x PATH -x LD_LIBRARY_PATH -x NCCL_DEBUG -x NCCL_SOCKET_IFNAME \
  "$ROOT/build/ptrain" --config "$CONFIG" "$@"
