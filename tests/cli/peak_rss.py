#!/usr/bin/env python3
"""The peak memory ptrain prints is its own, whoever launches it.

Linux carries getrusage's ru_maxrss from a parent into its child across fork + exec, so a
child's "peak RSS" read that way starts at its launcher's. This script holds a large, touched
allocation (1.5 GiB) and then runs a short ptrain training on the CPU as its child: every
`peak_mem_bytes` in metrics.jsonl must be below the parent's allocation and equal to the child's
own high-water mark range (under 1 GiB for the tiny run), and the console line must say the same.

Usage: peak_rss.py PTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

HOLD = 1536 << 20  # bytes the launcher keeps resident


def main():
    binary, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ballast = bytearray(HOLD)
    for i in range(0, HOLD, 4096):  # touch every page: resident, not just reserved
        ballast[i] = 1
    with open("/proc/self/status") as f:
        parent = int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024
    r = subprocess.run([binary, "--config", os.path.join(src, "configs/tiny.toml"), "--set", "training.device=cpu",
                        "--set", f"data.path={src}/data/fortunes.txt",
                        "--set", "training.steps=3", "--set", "training.eval_every=0", "--set", "checkpoint.save_final=false",
                        "--set", f"run.output_dir={work}/run", "--set", "data.seq_len=64", "--set", "data.micro_batch_size=2"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: ptrain exited {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    with open(f"{work}/run/metrics.jsonl") as f:
        peaks = [json.loads(line)["peak_mem_bytes"] for line in f if '"peak_mem_bytes"' in line]
    print(f"launcher high-water mark {parent / 2**20:.0f} MiB; ptrain's printed peaks "
          f"{', '.join(f'{p / 2**20:.0f}' for p in peaks)} MiB")
    ok = peaks and all(0 < p < min(parent, 1 << 30) for p in peaks)
    print("PASS" if ok else "FAIL: ptrain reported its launcher's memory as its own")
    del ballast
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
