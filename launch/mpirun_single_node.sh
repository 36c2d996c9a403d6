#!/usr/bin/env bash
# One node, NP ranks (one per GPU, or CPU ranks sharing the cores):
#   NP=8 launch/mpirun_single_node.sh configs/llama3_8b_mixed.toml [--set k=v ...]
# mpirun sets OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK; ptrain needs nothing else (rank 0 opens
# the NCCL store on a free port and shares it over MPI). GPU = local rank.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CONFIG=${1:?usage: NP=8 $0 CONFIG [--set k=v ...]}; shift
exec mpirun -np "${NP:-8}" --bind-to none --map-by slot "$ROOT/build/ptrain" --config "$CONFIG" "$@"
