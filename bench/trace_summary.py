"""Summarise a Chrome trace written by `training.profile_steps` (trace.rank<R>.json): how long
the traced steps took, how much of that the GPU was busy, and where its time went — kernels
grouped by kind and the longest kernels and CPU operators by total time.
    python3 bench/trace_summary.py RUN_DIR/trace.rank0.json [--steps N] [--top 20]
"""
import argparse
import json
import re
from collections import defaultdict

KINDS = [  # first match wins
    ("matmul (cuBLAS / CUTLASS)", re.compile(r"gemm|xmma|cutlass|nvjet|cublas", re.I)),
    ("attention (flash / mem-efficient)", re.compile(r"flash|fmha|attention", re.I)),
    ("NCCL", re.compile(r"nccl", re.I)),
    ("optimizer (fused AdamW, ptrain's AdamW kernels)", re.compile(r"FusedOptimizer|adamw_sr|adamw8bit", re.I)),
    ("ptrain's NF4 / rounding kernels", re.compile(r"nf4_kernel|stochastic_round|sr_kernel", re.I)),
    ("reductions / softmax / norms", re.compile(r"reduce|softmax|norm|logsumexp", re.I)),
    # dtype casts are copy kernels (bfloat16_copy_kernel_cuda); "nocast" in an elementwise
    # kernel's name (gpu_kernel_impl_nocast) is not a cast
    ("copies / casts / fills / concatenation",
     re.compile(r"copy_kernel|direct_copy|CatArray|FillFunctor|fill_kernel|index_elementwise|gather|scatter", re.I)),
    ("other elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def busy_us(intervals):
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=0, help="traced steps, for per-step figures")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    x = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in x if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    cpu = [e for e in x if e.get("cat") == "cpu_op"]
    if not x:
        raise SystemExit(f"{a.trace}: no timed events")
    start = min(e["ts"] for e in x)
    span = max(e["ts"] + e["dur"] for e in x) - start
    per = f" ({span / a.steps / 1e3:.1f} ms per step)" if a.steps else ""
    print(f"trace span {span / 1e3:.1f} ms{per}; {len(gpu)} GPU events, {len(cpu)} CPU operators")
    if gpu:
        busy = busy_us([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
        print(f"GPU busy {busy / 1e3:.1f} ms = {100 * busy / span:.1f} % of the span "
              f"(idle {100 - 100 * busy / span:.1f} %: waiting on the CPU, launches, synchronisation)")
        kinds, names = defaultdict(float), defaultdict(lambda: [0.0, 0])
        for e in gpu:
            name = e["name"]
            kind = e["cat"] if e["cat"] != "kernel" else next((k for k, r in KINDS if r.search(name)), "other")
            kinds[kind] += e["dur"]
            names[name][0] += e["dur"]
            names[name][1] += 1
        total = sum(kinds.values())
        print("\n| GPU time by kind | ms | share |\n|---|---|---|")
        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {v / 1e3:.1f} | {100 * v / total:.1f} % |")
        print(f"\n| longest kernels (total) | ms | calls | share |\n|---|---|---|---|")
        for n, (d, c) in sorted(names.items(), key=lambda kv: -kv[1][0])[: a.top]:
            print(f"| `{n[:110]}` | {d / 1e3:.2f} | {c} | {100 * d / total:.1f} % |")
    ops = defaultdict(lambda: [0.0, 0])
    for e in cpu:
        ops[e["name"]][0] += e["dur"]
        ops[e["name"]][1] += 1
    print(f"\n| CPU operators (inclusive time, nested ones counted in their callers too) | ms | calls |\n|---|---|---|")
    for n, (d, c) in sorted(ops.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"| `{n[:90]}` | {d / 1e3:.2f} | {c} |")


if __name__ == "__main__":
    main()
