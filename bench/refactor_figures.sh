#!/usr/bin/env bash
# The figures a refactor must leave unchanged, printed so two builds can be diffed:
#   bench/refactor_figures.sh BUILD_DIR > before.txt   (e.g. a worktree of the old commit)
#   bench/refactor_figures.sh build     > after.txt && diff before.txt after.txt
# 1. the tiny run (configs/tiny.toml, 30 steps, an eval at 15 and 30) and the tiny QLoRA run
#    (configs/tiny_qlora.toml, 20 steps): every logged loss and gradient norm, as metrics.jsonl
#    holds them (full precision);
# 2. the step-parity harness (tests/dist/step_parity.cpp) on hf_odd, hf_qwen3 and QLoRA over
#    hf_odd at 1 and 2 ranks: step 0's loss, the ten steps' losses and a sum of |gradient| per
#    run;
# 3. `check --plan` on the 70B bf16, 70B QLoRA and 8B QLoRA configs (the memory planner).
# Wall-clock figures (tokens/s, seconds) are left out: they differ between any two runs.
# Needs BUILD_DIR/ptrain and BUILD_DIR/tests/ptrain_step_parity, launch/setup.sh's venv and data/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: bench/refactor_figures.sh BUILD_DIR}" && pwd)
parity=$build/tests/ptrain_step_parity
py="${PTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ptrain/venv-torch-2.11.0}/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$root"

metrics() {  # the logged losses of a run's metrics.jsonl, no timings
  "$py" - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    keep = {k: r[k] for k in ("step", "loss", "grad_norm", "val_loss", "lr", "trained_tokens") if k in r}
    if len(keep) > 1:
        print(" ".join(f"{k}={v!r}" for k, v in keep.items()))
EOF
}

echo "## tiny run (30 steps)"
"$build/ptrain" --config configs/tiny.toml --set training.steps=30 --set training.log_every=5 \
  --set training.eval_every=15 --set checkpoint.save_final=false --set checkpoint.every_steps=0 \
  --set run.output_dir="$tmp/tiny" > "$tmp/tiny.log" 2>&1 || { cat "$tmp/tiny.log"; exit 1; }
metrics "$tmp/tiny/metrics.jsonl"

echo "## tiny QLoRA run (20 steps)"
"$build/ptrain" --config configs/tiny_qlora.toml --set training.steps=20 --set training.log_every=5 \
  --set training.eval_every=10 --set checkpoint.save_final=false --set checkpoint.every_steps=0 \
  --set run.output_dir="$tmp/qlora" > "$tmp/qlora.log" 2>&1 || { cat "$tmp/qlora.log"; exit 1; }
metrics "$tmp/qlora/metrics.jsonl"

fx=tests/fixtures
failed=0
for np in 1 2; do
  for run in "hf_odd $fx/hf_odd_step_expected.safetensors $fx/hf_odd" \
             "hf_qwen3 $fx/hf_qwen3_step_expected.safetensors $fx/hf_qwen3" \
             "qlora $fx/qlora_step_expected.safetensors $fx/hf_odd --qlora $fx/qlora_adapter"; do
    set -- $run
    name=$1
    echo "## step parity: $name, $np rank(s)"
    mpirun --oversubscribe --bind-to none -np "$np" "$parity" "$2" "$3" "$tmp/$name.$np.safetensors" "${@:4}" \
      > "$tmp/parity.log" 2>&1 || { echo "FAILED: $(head -1 "$tmp/parity.log")"; failed=1; continue; }
    "$py" - "$tmp/$name.$np.safetensors" <<'EOF'
import sys
from safetensors.torch import load_file
t = load_file(sys.argv[1])
for k in sorted(t):
    if not k.startswith("grad."):
        print(k, [float(x) for x in t[k].double().flatten()])
grads = [k for k in t if k.startswith("grad.")]
print("gradients", len(grads), "sum |g|", float(sum(t[k].double().abs().sum() for k in grads)))
EOF
  done
done

for plan in "llama3_70b_bf16 --world-size 8 --gpu-memory 80" "llama3_70b_qlora --world-size 2 --gpu-memory 24" \
            "llama3_8b_qlora --world-size 1 --gpu-memory 24"; do
  set -- $plan
  echo "## check --plan configs/$1.toml ${*:2}"
  "$build/ptrain" check --plan --config "configs/$1.toml" "${@:2}" 2>&1 | grep -v "took\|seconds" || true
done
exit $failed
