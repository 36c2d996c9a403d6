#!/usr/bin/env python3
"""The side-by-side table of bench/speed_vs_fsdp2.sh and bench/qlora_vs_peft.sh: reads
OUT/ptrain/metrics.jsonl and every reference's OUT/NAME.json (FSDP2's eager.json and
compiled.json; PEFT's peft.json, peft_prepare.json), each labelled by its "label" (else "FSDP2
NAME"); prints tokens/s, MFU and peak allocated memory with ptrain/reference ratios. MFU uses one FLOP count for every row (ptrain's 6N + attention,
from its metrics) over the GPU's dense bf16 peak.

Usage: speed_table.py OUT WARMUP_STEPS [PEAK_TFLOPS]
"""
import json
import math
import os
import statistics
import sys

# Dense bf16 tensor-core peaks (TFLOP/s) of the SXM parts.
KNOWN_PEAKS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def main():
    out, warmup = sys.argv[1], int(sys.argv[2])
    rows = [json.loads(l) for l in open(os.path.join(out, "ptrain", "metrics.jsonl")) if '"loss"' in l]
    rows = [r for r in rows if r["step"] > warmup]
    ptrain = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
              "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows), "peak_mem_source": rows[0]["peak_mem_source"]}
    flops_per_token = statistics.median(r["tflops"] * 1e12 / r["tokens_per_s"] for r in rows)
    order = ["eager", "compiled", "peft", "peft_prepare"]
    names = sorted((f[:-5] for f in os.listdir(out) if f.endswith(".json")),
                   key=lambda k: (order.index(k) if k in order else len(order), k))
    refs = {k: json.load(open(os.path.join(out, k + ".json"))) for k in names}
    name = next(iter(refs.values()))["device_name"] if refs else "?"
    if len(sys.argv) > 3 and sys.argv[3]:
        peak, source = float(sys.argv[3]), "PEAK_TFLOPS"
    else:
        peak, source = next(((v, k + " dense bf16") for k, v in KNOWN_PEAKS.items() if k in name), (math.nan, "unknown device"))
    print(f"device: {name} | peak {peak:g} TFLOP/s ({source}) | {flops_per_token / 1e9:.3f} GFLOP per token | "
          f"memory: {ptrain['peak_mem_source']}")
    print("| run | tokens/s | MFU | peak memory (GiB) | ptrain / run, tokens/s | ptrain / run, memory |")
    print("|---|---|---|---|---|---|")

    def row(label, r, ratios):
        mfu = r["tokens_per_s"] * flops_per_token / (peak * 1e12)
        print(f"| {label} | {r['tokens_per_s']:,.0f} | {100 * mfu:.1f} % | {r['peak_mem_bytes'] / 2**30:.2f} | {ratios} |")

    row("ptrain", ptrain, "— | —")
    for k, r in refs.items():
        row(r.get("label", f"FSDP2 {k}"), r, f"{ptrain['tokens_per_s'] / r['tokens_per_s']:.2f} | "
                            f"{ptrain['peak_mem_bytes'] / r['peak_mem_bytes']:.2f}")


if __name__ == "__main__":
    main()
