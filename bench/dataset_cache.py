#!/usr/bin/env python3
"""The sample cache (data.cache) on generated chat datasets of two sizes: the first run's
tokenize time, the second run's start, and each rank's peak RSS, beside the same run
tokenizing into memory on every rank (data.cache = false).

    $PTRAIN_VENV/bin/python bench/dataset_cache.py [PTRAIN_BIN] [--sizes 256,1024] [--np 2] [--steps 3]

Data: JSONL chats ({"messages": [...]}, 1 to 4 exchanges and a system prompt in a third of them),
their turns slices of the Python sources of the venv's packages at random offsets (seeded), to
SIZES MiB per file. Tokenizer: a byte-level BPE set up as Llama 3's (its regex), 32,000 tokens
trained by HF `tokenizers` on 16 MiB of that text, with Llama 3's chat tokens, so ptrain renders
the chats with Llama 3's template. Model: a small Llama over that vocabulary (dim 64, 2 layers),
trained STEPS steps at np ranks (seq_len 1024, packing) — the data, not the model, is measured.
For each size, three runs:
  build   data.cache on, an empty cache directory: rank 0 tokenizes into the cache
  mapped  the same again: every rank maps the cache
  memory  data.cache = false: every rank tokenizes the file into its own memory (before the cache)
Each rank runs under a small Python wrapper that reports the rank's own peak RSS (ru_maxrss of the
ptrain process; the wrapper's own few MiB are its floor). Printed: wall seconds of the whole run,
the tokenize / map seconds ptrain logs, the cache file's size, the largest and smallest rank peak.
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from tokenizer_speed import LLAMA3_SPLIT, corpus  # noqa: E402

CHAT_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
WRAPPER = ("import resource,subprocess,sys;rc=subprocess.run(sys.argv[1:]).returncode;"
           "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
           "print('PEAK_RSS_KIB',r,flush=True);sys.exit(rc)")


def make_tokenizer(text, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.split("\n"), trainers.BpeTrainer(
        vocab_size=32000, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(CHAT_TOKENS)
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    return tok.get_vocab_size()


def make_chats(text, path, mib, seed):
    rng = random.Random(seed)
    n = len(text)
    piece = lambda: text[(o := rng.randrange(n - 4096)):o + rng.randrange(40, 1500)]  # noqa: E731
    size, target = 0, mib << 20
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            messages = [{"role": "system", "content": piece()}] if rng.random() < 1 / 3 else []
            for _ in range(rng.randrange(1, 5)):
                messages += [{"role": "user", "content": piece()}, {"role": "assistant", "content": piece()}]
            line = json.dumps({"messages": messages}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
    return size


def run(binary, np_, args, env):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), sys.executable, "-c", WRAPPER, binary,
           "train"] + args
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"ptrain failed ({p.returncode}):\n{out[-4000:]}")
    peaks = [int(k) * 1024 for k in re.findall(r"PEAK_RSS_KIB (\d+)", out)]
    m = re.search(r"in ([0-9.]+) s \(([0-9,]+) tokens/s, (\d+) threads?\) into the cache", out)
    mapped = re.search(r"mapped from the cache \S+ in ([0-9.]+) s", out)
    memory = re.search(r"in ([0-9.]+) s \(([0-9,]+) tokens/s, (\d+) threads?\), held in memory", out)
    tokens = re.search(r"\| ([0-9,]+) tokens \| trained on", out)
    return {"wall": wall, "peaks": peaks, "tokens": int(tokens.group(1).replace(",", "")),
            "tokenize_s": float((m or memory).group(1)) if (m or memory) else None,
            "tokens_per_s": int((m or memory).group(2).replace(",", "")) if (m or memory) else None,
            "map_s": float(mapped.group(1)) if mapped else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "build/ptrain"))
    ap.add_argument("--sizes", default="256,1024", help="dataset sizes in MiB")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="ptrain_cache_bench_")
    os.makedirs(work, exist_ok=True)
    text = corpus(64)
    t0 = time.time()
    vocab = make_tokenizer(text[: 16 << 20], os.path.join(work, "tok"))
    print(f"tokenizer: byte-level BPE, {vocab:,} tokens with Llama 3's chat tokens (trained in {time.time() - t0:.0f} s)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    rows = []
    for mib in [int(s) for s in args.sizes.split(",")]:
        data = os.path.join(work, f"chats_{mib}mib.jsonl")
        t0 = time.time()
        size = make_chats(text, data, mib, seed=mib)
        print(f"data: {data}: {size / 2**20:,.0f} MiB of chats (generated in {time.time() - t0:.0f} s)", flush=True)
        cache = os.path.join(work, f"cache_{mib}")
        shutil.rmtree(cache, ignore_errors=True)
        common = ["--config", os.path.join(ROOT, "configs/tiny.toml"), "--set", "model.vocab_size=" + str(vocab),
                  "--set", "model.dim=64", "--set", "model.n_layers=2", "--set", "model.n_heads=4", "--set",
                  "model.n_kv_heads=2", "--set", "model.ffn_dim=128", "--set", "data.format=jsonl", "--set",
                  "data.path=" + data, "--set", "data.tokenizer=" + os.path.join(work, "tok"), "--set",
                  "data.seq_len=1024", "--set", "data.packing=true", "--set", "data.micro_batch_size=2", "--set",
                  f"training.steps={args.steps}", "--set", "training.eval_every=0", "--set",
                  "checkpoint.save_final=false"]
        cached = ["--set", "data.cache_dir=" + cache]
        for name, extra in [("build", cached), ("mapped", cached), ("memory", ["--set", "data.cache=false"])]:
            r = run(args.binary, args.np, common + ["--set", f"run.output_dir={work}/run_{mib}_{name}"] + extra, env)
            cache_bytes = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache))
            rows.append((mib, name, r, cache_bytes))
            print(f"  {name}: {r}", flush=True)
    print(f"\nnp = {args.np}, {os.cpu_count()} CPUs; figures in seconds and MiB (peak RSS: each rank's own)")
    print(f"{'data':>8} {'run':>7} {'tokens':>13} {'wall s':>8} {'tokenize s':>11} {'tokens/s':>11} {'map s':>7} "
          f"{'cache MiB':>10} {'peak RSS max':>13} {'min':>8}")
    for mib, name, r, cache_bytes in rows:
        print(f"{mib:>5} MiB {name:>7} {r['tokens']:>13,} {r['wall']:>8.1f} "
              f"{r['tokenize_s'] if r['tokenize_s'] is not None else '':>11} "
              f"{r['tokens_per_s'] if r['tokens_per_s'] is not None else '':>11} "
              f"{r['map_s'] if r['map_s'] is not None else '':>7} {cache_bytes / 2**20:>10.0f} "
              f"{max(r['peaks']) / 2**20:>13.0f} {min(r['peaks']) / 2**20:>8.0f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
