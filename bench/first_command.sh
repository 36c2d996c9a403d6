#!/usr/bin/env bash
# Times the README's first command as a newcomer meets it: a fresh clone of this checkout, a new
# torch venv (PTRAIN_VENV), an empty ccache (CCACHE_DIR) and pip's cache off, in a scratch
# directory; every output line is prefixed with the seconds since the start. The Debian packages
# are whatever the machine has (launch/setup.sh installs the missing ones, which then counts).
#   bench/first_command.sh [SCRATCH_DIR]     (default: a new directory under /tmp; ~3 GB)
# Prints the milestones at the end: setup done, first loss, run done.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-$(mktemp -d /tmp/ptrain-first-XXXXXX)}
mkdir -p "$scratch"
git clone -q "$root" "$scratch/ptrain"
export PTRAIN_VENV=$scratch/venv CCACHE_DIR=$scratch/ccache PIP_NO_CACHE_DIR=1
log=$scratch/first_command.log
start=$(date +%s.%N)
cd "$scratch/ptrain"
{ launch/setup.sh && build/ptrain --config configs/tiny.toml; echo "exit code $?"; } 2>&1 |
  while IFS= read -r line; do
    printf '%7.1f %s\n' "$(python3 -c "import time; print(time.time() - $start)")" "$line"
  done | tee "$log"
echo "--- milestones (seconds since the start; log: $log)"
grep -m1 "setup\] installing into" "$log" || true
grep -m1 "setup\] configuring" "$log" || true
grep -m1 "setup\] done" "$log" || true
grep -m1 " step 1/" "$log" || true
grep -m1 "done\. outputs" "$log" || true
