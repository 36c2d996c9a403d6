#!/usr/bin/env bash
# Every GPU check of ptrain on a machine with one CUDA GPU and no network (docs/gpu.md): builds
# against the bundle of launch/gpu_bundle.sh, then measures, writing every figure to one results
# file. Stages, each well inside 10 minutes on a 16-core H100/H200 machine, each done once
# (a later call skips the done ones; naming a stage runs it again):
#   env      unpack the bundle, link its datasets into data/, print the machine (GPU, compilers,
#            glibc, torch) and prove there is no network
#   build    configure against the bundle (sm_90) and build ptrain, its tests and the kernel benchmark
#   kernels  the CUDA tests — kernels against their CPU references, NCCL at one rank, the rank's device —
#            (a skip is reported as a skip) and kernel throughput (GB/s)
#   smoke    the tiny config trained for 20 steps on the default device, and `ptrain check`
#   nccl     NCCL at world size 1 in fp32 / mixed / bf16 with all-gather prefetch on and off, beside
#            the same run in one process without collectives
#   memory   the planner's predicted peak (`ptrain check`) against the CUDA allocator's
#            max_memory_allocated of the same run, for full fine-tunes, QLoRA, checkpointing, offloading
#   race     the speed race against PyTorch FSDP2, eager and compiled (bench/speed_vs_fsdp2.sh), mixed
#   race_bf16  the same race in pure bf16
#   fusions  the race's ptrain run with each [kernels] fusion off and on, and all on (docs/kernels.md):
#            tokens/s, peak allocated, loss at the last step, side by side
#   qlora    QLoRA of an 8B-shaped Llama (configs/llama3_8b_qlora.toml, random base) against PEFT +
#            bitsandbytes (bench/qlora_vs_peft.sh; bitsandbytes from the bundle's py/site)
#   profile  a Kineto trace of three steps of the race's ptrain run (training.profile_steps),
#            summarised by bench/trace_summary.py; the trace is kept, gzipped, for later study
#   profile_qlora  the same for the qlora stage's ptrain run (8B-shaped QLoRA)
# Without a GPU the GPU stages say so and record "not run"; a skipped test is never a pass.
#
#   bench/gpu_checks.sh [STAGE ...]     (default: every stage not yet done, in the order above)
#
# Environment: PTRAIN_BUNDLE (default .gpu-bundle), PTRAIN_BUILD (default build-gpu), OUT (the
# results file and a tarball of the logs are copied there at the end of every call).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUNDLE="${PTRAIN_BUNDLE:-$ROOT/.gpu-bundle}"
export PTRAIN_BUILD="${PTRAIN_BUILD:-$ROOT/build-gpu}"
STATE="$PTRAIN_BUILD/gpu-checks"
# The bundle's packages unpacked beside the build, not inside the bundle: each device call carries
# .gpu-bundle afresh and replaces that folder, while the build folder stays between calls.
SYSROOT="$STATE/root"
RESULTS="$STATE/results.md"
LOGS="$STATE/logs"
BIN="$PTRAIN_BUILD/ptrain"
ALL_STAGES=(env build kernels smoke nccl memory race race_bf16 fusions qlora profile profile_qlora)
mkdir -p "$LOGS"

# The python3 on PATH holds torch (the GPU machine's own; never carried): CMake and the bench
# scripts use its environment.
PY="$(command -v python3)" || { echo "gpu_checks: no python3 on PATH" >&2; exit 1; }
PTRAIN_VENV="$("$PY" -c 'import sys; print(sys.prefix)')"
export PTRAIN_VENV
# The bundle's pkg-config (and its library) for CMake's pkg_check_modules.
export PKG_CONFIG_LIBDIR="$SYSROOT/usr/lib/x86_64-linux-gnu/pkgconfig:$SYSROOT/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$SYSROOT"
# The bundle's shared libraries that the system lacks (links in $STATE/lib, made by the env
# stage): on the loader's path for everything this script runs. An rpath would not do: libmpi
# finds its own libraries through its RUNPATH, which names /usr/lib/x86_64-linux-gnu/openmpi.
export LD_LIBRARY_PATH="$STATE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

record() { printf '%s\n' "$*" | tee -a "$RESULTS"; }
have_gpu() { "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
finish() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  cp "$RESULTS" "$OUT/gpu_results.md" 2>/dev/null
  tar czf "$OUT/gpu_logs.tgz" -C "$STATE" --exclude='*.json.gz' logs 2>/dev/null
  cp "$LOGS"/*.json.gz "$OUT/" 2>/dev/null  # the profile's trace, apart: it is the largest
}
trap finish EXIT

# metrics.jsonl of a run -> "median tokens/s, max peak bytes, last loss" over the steps after the first 5.
summarize() {
  "$PY" - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
late = [r for r in rows if r["step"] > 5] or rows
print(f'{statistics.median(r["tokens_per_s"] for r in late):.0f} {max(r["peak_mem_bytes"] for r in rows)} '
      f'{rows[-1]["loss"]:.6f} {rows[0]["peak_mem_source"]}')
PY
}
NOT_RUN=0  # set by a GPU stage on a machine without one: the stage is not marked done
needs_gpu() {
  have_gpu && return 0
  record "not run: no CUDA device visible to torch (this stage measures the GPU)"
  NOT_RUN=1
  return 1
}

stage_env() {
  if [ ! -d "$SYSROOT/usr" ]; then
    ls "$BUNDLE"/debs/*.deb >/dev/null 2>&1 ||
      { record "FAILED: no bundle at $BUNDLE (run launch/gpu_bundle.sh on a machine with apt and carry it)"; return 1; }
    mkdir -p "$SYSROOT.tmp"
    for d in "$BUNDLE"/debs/*.deb; do dpkg-deb -x "$d" "$SYSROOT.tmp" || return 1; done
    mv "$SYSROOT.tmp" "$SYSROOT"
  fi
  rm -rf "$STATE/lib" && mkdir -p "$STATE/lib"
  local lib kept=()
  for lib in "$SYSROOT"/{usr/,}lib/x86_64-linux-gnu/*.so.* "$SYSROOT"/usr/lib/x86_64-linux-gnu/openmpi/lib/*.so.*; do
    [ -e "$lib" ] || continue
    local own; own=$("$(command -v ldconfig || echo /sbin/ldconfig)" -p | awk -v n="${lib##*/}" '$1 == n {print $NF; exit}')
    if [ -n "$own" ] && [ -e "$own" ]; then kept+=("${lib##*/}"); else ln -sf "$lib" "$STATE/lib/"; fi
  done
  mkdir -p "$ROOT/data"
  for f in "$BUNDLE"/data/*; do [ -e "$ROOT/data/${f##*/}" ] || ln -s "$f" "$ROOT/data/${f##*/}"; done
  record "- bundle: $(ls "$BUNDLE"/debs/*.deb | wc -l) packages, $(du -sm "$BUNDLE/debs" | cut -f1) MiB of .debs, unpacked in $SYSROOT; the system's own ${kept[*]:-(none)} used instead of the bundle's"
  record "- machine: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), glibc $(ldd --version | head -1 | awk '{print $NF}') (the bundle needs $(sed -n 2p "$BUNDLE/MANIFEST" | grep -o 'GLIBC_[0-9.]*'))"
  record "- compilers: $(c++ --version | head -1); $(nvcc --version 2>/dev/null | tail -1 || echo 'no nvcc')"
  record "- tools: $(cmake --version | head -1), ninja $(ninja --version), pkgconf $(LD_LIBRARY_PATH="$SYSROOT/usr/lib/x86_64-linux-gnu" "$SYSROOT/usr/bin/pkgconf" --version) (bundle)"
  record "- python: $("$PY" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)')"
  record "- GPU: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) + ", %.1f GiB" % (torch.cuda.get_device_properties(0).total_memory / 2**30) if torch.cuda.is_available() else "none visible to torch")')"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOGS/env.log" 2>&1
  record "- network: $("$PY" - <<'PY'
import socket
out = []
for host in ("pypi.org", "1.1.1.1"):  # a name, and an address needing no name lookup
    try:
        socket.create_connection((host, 443), timeout=5).close()
        out.append(f"REACHABLE ({host}:443 answered)")
    except OSError as e:
        out.append(f"unreachable ({host}:443: {e})")
print("; ".join(out))
PY
)"
}

stage_build() {
  [ -d "$SYSROOT/usr" ] || stage_env || return 1
  local libdir="$SYSROOT/usr/lib/x86_64-linux-gnu" t0=$SECONDS
  local pkgconf="$STATE/pkg-config"
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$libdir" "$SYSROOT/usr/bin/pkgconf" > "$pkgconf"
  chmod +x "$pkgconf"
  cmake -S "$ROOT" -B "$PTRAIN_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_VENV="$PTRAIN_VENV" \
    -DPTRAIN_CUDA_ARCHS="${PTRAIN_CUDA_ARCHS:-90}" -DCMAKE_PREFIX_PATH="$SYSROOT/usr" \
    -DPKG_CONFIG_EXECUTABLE="$pkgconf" -DMPI_C_COMPILER=MPI_C_COMPILER-NOTFOUND -DMPI_C_LIB_NAMES=mpi \
    -DMPI_C_HEADER_DIR="$libdir/openmpi/include" -DMPI_mpi_LIBRARY="$libdir/openmpi/lib/libmpi.so" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$libdir" \
    > "$LOGS/configure.log" 2>&1 || { record "FAILED: configure (logs/configure.log):"; tail -25 "$LOGS/configure.log"; return 1; }
  cmake --build "$PTRAIN_BUILD" -j "$(nproc)" --target ptrain ptrain_tests $(have_gpu && echo ptrain_bench_kernels) \
    > "$LOGS/build.log" 2>&1 || { record "FAILED: build (logs/build.log):"; grep -m5 -B2 -A8 "error" "$LOGS/build.log"; return 1; }
  record "- built in $((SECONDS - t0)) s on $(nproc) cores: $(grep -m1 "Parquet:" "$LOGS/configure.log" | sed 's/^-- //'); kernels for sm_${PTRAIN_CUDA_ARCHS:-90}"
  "$BIN" --version >> "$LOGS/build.log" 2>&1 || { record "FAILED: $BIN does not run"; return 1; }
}

stage_kernels() {
  # The CUDA kernels against their CPU references, NCCL at one rank and the rank's device, through
  # the test binary itself so that a skip's reason is seen; a skipped test is reported as skipped, never as passed.
  "$PTRAIN_BUILD/tests/ptrain_tests" --gtest_filter='*Cuda*' > "$LOGS/kernels.log" 2>&1
  local rc=$?
  record "- CUDA tests (rc $rc): $(grep -E '^\[ +(OK|SKIPPED|FAILED) +\] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \([0-9]+ ms\)$' "$LOGS/kernels.log" |
    sed -E 's/^\[ +([A-Z]+) +\] ([^ ]+).*/\2 \1/' | paste -sd';' | sed 's/;/; /g')"
  grep -q "SKIPPED \]" "$LOGS/kernels.log" &&
    record "  (skipped is not passed; the reason given: $(grep -m1 -A1 ': Skipped$' "$LOGS/kernels.log" | tail -1))"
  needs_gpu || return $rc
  "$PTRAIN_BUILD/ptrain_bench_kernels" > "$LOGS/kernel_bench.log" 2>&1 || { record "FAILED: ptrain_bench_kernels"; return 1; }
  record "- kernel throughput:"
  record '```'
  record "$(cat "$LOGS/kernel_bench.log")"
  record '```'
  return $rc
}

stage_smoke() {
  local run="$STATE/runs/smoke"
  rm -rf "$run"
  "$BIN" --config "$ROOT/configs/tiny.toml" --set training.steps=20 --set training.log_every=5 \
    --set training.eval_every=0 --set checkpoint.save_final=false --set run.output_dir="$run" > "$LOGS/smoke.log" 2>&1 ||
    { record "FAILED: tiny training run (logs/smoke.log)"; tail -20 "$LOGS/smoke.log"; return 1; }
  read -r tps peak loss source <<< "$(summarize "$run/metrics.jsonl")"
  record "- tiny, 20 steps on $(have_gpu && echo CUDA || echo the CPU) (training.device auto): loss $loss, $tps tokens/s, peak $peak bytes ($source)"
  "$BIN" check --config "$ROOT/configs/tiny.toml" > "$LOGS/smoke_check.log" 2>&1 || { record "FAILED: ptrain check"; return 1; }
  record "- ptrain check: $(grep "^  peak" "$LOGS/smoke_check.log" | sed 's/^ *//')"
  # The CPU references the kernel tests compare against, and the optimizer's rounding modes.
  "$PTRAIN_BUILD/tests/ptrain_tests" --gtest_filter='AdamW*:AdamW8bit*:Nf4*:StochasticRounding*:UpdateRounding*' \
    > "$LOGS/smoke_tests.log" 2>&1 || { record "FAILED: unit tests (logs/smoke_tests.log)"; return 1; }
  record "- unit tests of the kernels' CPU references and the update rounding: $(grep -E '^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ tests?' "$LOGS/smoke_tests.log" | sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+) tests?.*/\2 \1/' | paste -sd',' | sed 's/,/, /g') (the skipped ones are the CUDA comparisons)"
}

stage_nccl() {
  needs_gpu || return 0
  record "| mode | collectives | prefetch | rc | tokens/s (median, steps 6-50) | peak allocated (bytes) | loss at step 50 |"
  record "|---|---|---|---|---|---|---|"
  local fails=0
  for mode in fp32 mixed bf16; do
    for comm in nccl none; do
      for prefetch in true false; do
        [ $comm = none ] && [ $prefetch = false ] && continue
        local run="$STATE/runs/nccl_${mode}_${comm}_prefetch_$prefetch" launch=()
        rm -rf "$run"
        # nccl: world size 1 through ProcessGroupNCCL; none: one process, no launcher, no collectives.
        [ $comm = nccl ] && launch=(env MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0)
        "${launch[@]}" "$BIN" --config "$ROOT/configs/tiny.toml" --set training.device=cuda \
          --set parallel.backend=$([ $comm = nccl ] && echo nccl || echo auto) \
          --set precision.mode=$mode --set parallel.prefetch=$prefetch --set training.steps=50 \
          --set training.log_every=1 --set training.token_metrics=false --set training.eval_every=0 --set checkpoint.save_final=false \
          --set run.output_dir="$run" > "$LOGS/nccl_${mode}_${comm}_$prefetch.log" 2>&1
        local rc=$?
        ((rc)) && fails=1
        read -r tps peak loss _ <<< "$(summarize "$run/metrics.jsonl" 2>/dev/null)"
        record "| $mode | $comm | $prefetch | $rc | ${tps:-} | ${peak:-} | ${loss:-} |"
      done
    done
  done
  record "(prefetch changes the schedule, not the arithmetic, and NCCL at one rank only moves bytes: within a mode"
  record " the three losses should agree — to the bit where cuBLAS and attention are deterministic)"
  return $fails
}

stage_memory() {
  needs_gpu || return 0
  record "| run | predicted peak (bytes) | max_memory_allocated (bytes) | measured / predicted | forward | backward | optimizer | at forward's start | at backward's start |"
  record "|---|---|---|---|---|---|---|---|---|"
  local fails=0 name config sets
  while IFS='|' read -r name config sets; do
    local run="$STATE/runs/memory_$name"
    rm -rf "$run"
    # shellcheck disable=SC2086  # sets are separate --set arguments
    "$BIN" check --config "$ROOT/$config" $sets > "$LOGS/memory_${name}_check.log" 2>&1
    local predicted; predicted=$(grep "^  peak" "$LOGS/memory_${name}_check.log" | grep -o '([0-9,]* bytes)' | tr -dc '0-9')
    # shellcheck disable=SC2086
    "$BIN" --config "$ROOT/$config" $sets --set training.steps=6 --set training.log_every=1 --set training.token_metrics=false --set training.eval_every=0 \
      --set checkpoint.save_final=false --set checkpoint.every_steps=0 --set run.output_dir="$run" \
      > "$LOGS/memory_$name.log" 2>&1 || { fails=1; record "| $name | ${predicted:-?} | FAILED (logs/memory_$name.log) | |"; continue; }
    read -r _ peak _ source <<< "$(summarize "$run/metrics.jsonl")"
    # Each phase's highest peak over the steps against the plan's "by phase" line, and the
    # allocated bytes as forward and backward began against its "phase starts" (measured / predicted).
    local phases; phases=$("$PY" - "$run/metrics.jsonl" "$LOGS/memory_${name}_check.log" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
lines = open(sys.argv[2]).read().splitlines()
def plan(label, n):
    line = next((l for l in lines if l.strip().startswith(label)), "")
    return ([int(x.replace(",", "")) for x in re.findall(r"([0-9,]+) bytes", line)] + [0] * n)[:n]
out = []
keys = ("peak_forward_bytes", "peak_backward_bytes", "peak_optimizer_bytes",
        "allocated_forward_start_bytes", "allocated_backward_start_bytes")
for key, want in zip(keys, plan("by phase", 3) + plan("phase starts", 2)):
    got = max((r.get(key, -1) for r in rows), default=-1)
    out.append(f"{got / want:.3f}" if got >= 0 and want > 0 else "?")
print(" | ".join(out))
PY
)
    record "| $name | $predicted | $peak ($source) | $(awk -v a="$peak" -v b="$predicted" 'BEGIN {printf "%.3f", a / b}') | $phases |"
  done <<'RUNS'
tiny_fp32|configs/tiny.toml|--set training.device=cuda --set precision.mode=fp32
tiny_mixed_b16x512|configs/tiny.toml|--set training.device=cuda --set precision.mode=mixed --set data.micro_batch_size=16 --set data.seq_len=512
tiny_bf16_b16x512_ckpt|configs/tiny.toml|--set training.device=cuda --set precision.mode=bf16 --set data.micro_batch_size=16 --set data.seq_len=512 --set memory.activation_checkpointing=full
tiny_bf16_b16x512_offload|configs/tiny.toml|--set training.device=cuda --set precision.mode=bf16 --set data.micro_batch_size=16 --set data.seq_len=512 --set memory.activation_checkpointing=full --set memory.activation_offloading=true
tiny_qlora|configs/tiny_qlora.toml|--set training.device=cuda
chat_qlora_padded|configs/tiny_chat_qlora.toml|--set training.device=cuda --set data.packing=false --set data.micro_batch_size=32 --set data.seq_len=256
chat_qlora_packed|configs/tiny_chat_qlora.toml|--set training.device=cuda --set data.packing=true --set data.micro_batch_size=32 --set data.seq_len=256
llama3_2_1b_mixed|configs/llama3_2_1b_mixed.toml|--set training.device=cuda
llama3_2_1b_bf16_adam8bit_ckpt|configs/llama3_2_1b_mixed.toml|--set training.device=cuda --set precision.mode=bf16 --set optimizer.name=adamw8bit --set memory.activation_checkpointing=full
llama3_8b_qlora|configs/llama3_8b_qlora.toml|--set training.device=cuda --set data.path=data/fortunes.txt --set data.format=text --set data.packing=false --set training.grad_accum_steps=1
dpo_qlora|configs/tiny_dpo_qlora.toml|--set training.device=cuda --set data.micro_batch_size=16
dpo_qlora_tied|configs/tiny_dpo_qlora.toml|--set training.device=cuda --set data.micro_batch_size=16 --set model.hf_path=tests/fixtures/hf_qwen_chat --set lora.targets=["q","k","v","o","gate","up","down"]
simpo_full_mixed_tied|configs/tiny_dpo_qlora.toml|--set training.device=cuda --set data.micro_batch_size=16 --set model.hf_path=tests/fixtures/hf_qwen_chat --set training.objective=simpo --set lora.enabled=false --set quant.base=none --set precision.mode=mixed
RUNS
  record "(the planner is an upper bound of the step's schedule: measured / predicted should be at most 1 and close to it;"
  record " the phase columns are each phase's peak and the allocated bytes as forward and backward began, measured / predicted)"
  record "- the plan's $(grep -h -m1 '^  library workspace' "$LOGS"/memory_tiny_fp32_check.log | sed 's/^ *//')"
  return $fails
}

# race_in MODE: bench/speed_vs_fsdp2.sh on Llama 3.2 1B in that precision mode.
race_in() {
  needs_gpu || return 0
  OUT="$STATE/runs/race_$1" bash "$ROOT/bench/speed_vs_fsdp2.sh" "$ROOT/configs/llama3_2_1b_mixed.toml" 30 \
    --set precision.mode="$1" > "$LOGS/race_$1.log" 2>&1 || { record "FAILED: speed race (logs/race_$1.log)"; tail -20 "$LOGS/race_$1.log"; return 1; }
  record "$(grep -v "^logs and metrics" "$LOGS/race_$1.log")"
}
stage_race() { race_in mixed; }
stage_race_bf16() { race_in bf16; }

# The [kernels] switches the fusions stage races (docs/kernels.md); a new fused kernel adds its key here.
FUSIONS=(fused_swiglu fused_rope fused_loss fused_grad_norm)

stage_fusions() {
  needs_gpu || return 0
  local steps=30 fails=0 variant
  record "Llama 3.2 1B mixed, 4 x 2048 tokens, $steps steps, world size 1; tokens/s: median of steps 6-$steps"
  record "| kernels | rc | tokens/s | vs none | peak allocated (bytes) | loss at step $steps |"
  record "|---|---|---|---|---|---|"
  local base_tps=""
  local variants=(none "${FUSIONS[@]}")
  ((${#FUSIONS[@]} > 1)) && variants+=(all)  # (with one fusion, "all" is that one)
  for variant in "${variants[@]}"; do
    local run="$STATE/runs/fusions_$variant" sets=()
    for f in "${FUSIONS[@]}"; do  # every switch set: the defaults are all on
      if [ "$variant" = all ] || [ "$variant" = "$f" ]; then sets+=(--set "kernels.$f=true"); else sets+=(--set "kernels.$f=false"); fi
    done
    rm -rf "$run"
    "$BIN" --config "$ROOT/configs/llama3_2_1b_mixed.toml" --set training.device=cuda --set training.steps=$steps \
      --set training.log_every=1 --set training.token_metrics=false --set training.eval_every=0 --set checkpoint.save_final=false \
      --set checkpoint.every_steps=0 --set run.output_dir="$run" "${sets[@]}" > "$LOGS/fusions_$variant.log" 2>&1
    local rc=$?
    ((rc)) && fails=1
    read -r tps peak loss _ <<< "$(summarize "$run/metrics.jsonl" 2>/dev/null)"
    [ "$variant" = none ] && base_tps=$tps
    record "| $variant | $rc | ${tps:-} | $(awk -v a="${tps:-0}" -v b="${base_tps:-0}" 'BEGIN {if (b > 0) printf "%.3fx", a / b}') | ${peak:-} | ${loss:-} |"
  done
  record "(a fusion changes no arithmetic on the CPU; on the GPU its kernel rounds once where the composite path"
  record " rounds after each operation, so the losses agree to bf16 rounding, not to the bit)"
  return $fails
}

stage_qlora() {
  needs_gpu || return 0
  local site="$BUNDLE/py/site"
  [ -d "$site/bitsandbytes" ] ||
    { record "FAILED: no bitsandbytes in the bundle ($site): run launch/gpu_bundle.sh again and carry it"; return 1; }
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" OUT="$STATE/runs/qlora" \
    bash "$ROOT/bench/qlora_vs_peft.sh" "$ROOT/configs/llama3_8b_qlora.toml" 10 > "$LOGS/qlora.log" 2>&1 ||
    { record "FAILED: QLoRA race (logs/qlora.log)"; tail -20 "$LOGS/qlora.log"; return 1; }
  record "$(grep -v "^logs and metrics" "$LOGS/qlora.log")"
}

# profile_run NAME CONFIG STEPS [--set k=v ...]: a Kineto trace of steps STEPS-4..STEPS-2 of a run,
# summarised by bench/trace_summary.py; the trace kept, gzipped, as logs/trace_NAME.json.gz.
profile_run() {
  local name=$1 config=$2 steps=$3; shift 3
  local run="$STATE/runs/profile_$name" first=$((steps - 4))
  rm -rf "$run"
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29521 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
    "$BIN" --config "$ROOT/$config" --set training.device=cuda --set training.steps="$steps" \
    --set training.profile_start=$first --set training.profile_steps=3 --set training.log_every=1 --set training.token_metrics=false \
    --set training.eval_every=0 --set checkpoint.save_final=false --set checkpoint.every_steps=0 \
    --set run.output_dir="$run" "$@" > "$LOGS/profile_$name.log" 2>&1 ||
    { record "FAILED: profiled run (logs/profile_$name.log)"; tail -20 "$LOGS/profile_$name.log"; return 1; }
  record "- $name, steps $first-$((first + 2)) traced (tracing slows them; untraced step $((first - 1)): $(grep -o '[0-9.]* s/step' "$LOGS/profile_$name.log" | sed -n "$((first - 1))p"))"
  "$PY" "$ROOT/bench/trace_summary.py" "$run/trace.rank0.json" --steps 3 > "$LOGS/profile_${name}_summary.md" 2>&1 ||
    { record "FAILED: bench/trace_summary.py"; tail -5 "$LOGS/profile_${name}_summary.md"; return 1; }
  record "$(cat "$LOGS/profile_${name}_summary.md")"
  gzip -c "$run/trace.rank0.json" > "$LOGS/trace_$name.json.gz"
  record "(trace: logs/trace_$name.json.gz, $(du -m "$LOGS/trace_$name.json.gz" | cut -f1) MiB)"
}

stage_profile() {
  needs_gpu || return 0
  profile_run llama3_2_1b_mixed configs/llama3_2_1b_mixed.toml 10
}

# The 8B-shaped QLoRA of the qlora stage (random base, 4 x 2048 tokens of the fortunes corpus).
stage_profile_qlora() {
  needs_gpu || return 0
  profile_run llama3_8b_qlora configs/llama3_8b_qlora.toml 8 --set data.path="$ROOT/data/fortunes.txt" \
    --set data.format=text --set data.packing=false --set training.grad_accum_steps=1
}

stages=("$@")
((${#stages[@]})) || for s in "${ALL_STAGES[@]}"; do [ -e "$STATE/$s.done" ] || stages+=("$s"); done
status=0
for s in "${stages[@]}"; do
  declare -F "stage_$s" >/dev/null || { echo "gpu_checks: unknown stage '$s' (stages: ${ALL_STAGES[*]})" >&2; exit 2; }
done
for s in "${stages[@]}"; do
  record ""
  record "## $s ($(date -u +%FT%TZ))"
  t0=$SECONDS
  NOT_RUN=0
  if "stage_$s"; then
    if ((NOT_RUN)); then
      record "($s: not run, not marked done)"
    else
      touch "$STATE/$s.done"
      record "($s: done in $((SECONDS - t0)) s)"
    fi
  else
    status=1
    record "($s: FAILED after $((SECONDS - t0)) s)"
    [ "$s" = env ] || [ "$s" = build ] && break  # nothing after can run
  fi
done
echo "results: $RESULTS${OUT:+ (copied to $OUT/gpu_results.md, logs in $OUT/gpu_logs.tgz)}"
exit $status
