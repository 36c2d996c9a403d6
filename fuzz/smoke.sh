#!/usr/bin/env bash
# Fuzzes one target for a bounded time from its committed inputs (corpus, seeds, regressions): new inputs go to a scratch
# directory, a crashing input to FINDINGS/<target>/ (commit it under fuzz/regressions/<target>/
# once fixed). Prints libFuzzer's final counts (inputs run, coverage).
#
#   fuzz/smoke.sh FUZZ_BINARY FUZZ_DIR TARGET SECONDS FINDINGS
set -uo pipefail
bin=$1; dir=$2; target=$3; seconds=$4; findings=$5/$target
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/corpus" "$scratch/tmp"
export PTRAIN_FUZZ_TMP="$scratch/tmp"  # the files the targets write their inputs to
mkdir -p "$findings"
"$bin" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 -max_len=65536 \
  -artifact_prefix="$findings/" "$scratch/corpus" "$dir/corpus/$target" "$dir/seeds/$target" "$dir/regressions/$target" 2>&1 \
  | grep -E "^(stat::|#[0-9]+[[:space:]]+DONE|==[0-9]+==ERROR|SUMMARY|artifact_prefix|Test unit written)|INFO: seed corpus|DEDUP"
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] && echo "fuzz $target: no finding in $seconds s" || echo "fuzz $target: FINDING (exit $rc), input in $findings"
exit $rc
