#!/usr/bin/env python3
"""Decoding speed and memory: `ptrain generate` against transformers' `generate`, batch 1, greedy,
the same model, dtype (float32) and CPU threads, side by side.

    $PTRAIN_VENV/bin/python bench/generate_speed.py [PTRAIN_BIN] [--threads 2] [--new 128] [--prompt 64]
                                                    [--models 100m,7m]

The models: Llamas of about 100M parameters (dim 640, 12 layers, 10 heads / 5 KV heads, FFN 1,728,
vocabulary 32,000) and 7M (dim 256, 4 layers, 4 / 2 heads, FFN 688, vocabulary 8,000), random
weights saved by transformers as HF directories, no end-of-sequence token (both decode exactly
NEW tokens). The prompt: PROMPT random ids. Each side runs in its own
process, twice (the second is reported): ptrain's own prompt / decode tokens/s and its peak RSS;
transformers' `generate(max_new_tokens=1)` and `(max_new_tokens=NEW)` timed, the decode rate being
(NEW - 1) / the difference, and its process's peak RSS. The generated ids are compared. The
"ceiling" row is the time of one matrix-vector product per Linear weight (torch, same threads):
reading every weight once, as any decoder built on per-weight BLAS calls must. The "peak stream"
row reads the same number of bytes as one long matrix-vector product: the machine's read rate,
a bound even for a fused decode kernel that does nothing else.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HF = r"""
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
d, threads, new, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
torch.set_num_threads(threads)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
x = torch.tensor([prompt])
def gen(n):
    t = time.perf_counter()
    with torch.no_grad():
        out = m.generate(x, do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return time.perf_counter() - t, out[0, len(prompt):].tolist()
for _ in range(2):
    one, _ = gen(1)
    full, ids = gen(new)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
# The floor of a decoded token: one matrix-vector product per Linear weight (every projection and
# lm_head; the embedding reads one row), nothing else, timed the same way (best of 20).
weights = [mod.weight for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
vecs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in weights}
def matvecs():
    t = time.perf_counter()
    with torch.no_grad():
        for w in weights:
            torch.nn.functional.linear(vecs[w.shape[1]], w)
    return time.perf_counter() - t
floor_s = min(matvecs() for _ in range(20))
# The machine's peak read rate: one matrix-vector product over a single matrix as large as all of
# those weights together (no per-call overhead, one long stream).
weight_bytes = sum(w.numel() * w.element_size() for w in weights)
dim = weights[0].shape[1]
big = torch.randn(dim, weight_bytes // 4 // dim)  # long rows: the fastest layout for a matrix-vector product
vec = torch.randn(1, big.shape[1])
def one_stream():
    t = time.perf_counter()
    with torch.no_grad():
        torch.nn.functional.linear(vec, big)
    return time.perf_counter() - t
stream_s = min(one_stream() for _ in range(10))
print(json.dumps({"prefill_s": one, "decode_tps": (new - 1) / (full - one), "ids": ids, "peak_kib": int(hwm),
                  "floor_tps": 1 / floor_s, "stream_tps": 1 / stream_s, "weight_bytes": weight_bytes}))
"""

WRAP = ("import resource,subprocess,sys;p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
        "print(p.stdout+p.stderr);print('PEAK_KIB',resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
        "sys.exit(p.returncode)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "build/ptrain"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--models", default="100m,7m")
    args = ap.parse_args()
    for name in args.models.split(","):
        bench(args, name)


SPECS = {"100m": dict(hidden_size=640, num_hidden_layers=12, num_attention_heads=10, num_key_value_heads=5,
                      intermediate_size=1728, vocab_size=32000),
         "7m": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=688, vocab_size=8000)}


def bench(args, name):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    work = tempfile.mkdtemp(prefix="ptrain_gen_bench_")
    model_dir = os.path.join(work, "model")
    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=1024, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None, **SPECS[name])
    model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    del model
    vocab = SPECS[name]["vocab_size"]
    prompt = torch.randint(0, vocab, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write("x" * 4096)
    config = os.path.join(work, "gen.toml")
    with open(config, "w") as f:
        f.write(f'[model]\nhf_path = "{model_dir}"\n[data]\npath = "{work}/corpus.txt"\n[training]\ndevice = "cpu"\n'
                f'threads = {args.threads}\n')
    with open(os.path.join(work, "in.jsonl"), "w") as f:
        f.write(json.dumps({"ids": prompt}) + "\n")
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", WRAP, args.binary, "generate", "--config", config, "--in",
                            os.path.join(work, "in.jsonl"), "--out", os.path.join(work, "out.jsonl"),
                            "--max-new-tokens", str(args.new)], capture_output=True, text=True, check=True)
    m = re.search(r"prompt (\d+) tokens in ([0-9.]+) s .*?\| (\d+) new tokens, decoded in ([0-9.]+) s after the first "
                  r"\(([0-9,]+) tokens/s\) \| KV cache ([0-9.]+ \w+)", p.stdout)
    ours = {"prefill_s": float(m.group(2)), "decode_tps": float(m.group(5).replace(",", "")), "cache": m.group(6),
            "peak_kib": int(re.search(r"PEAK_KIB (\d+)", p.stdout).group(1))}
    with open(os.path.join(work, "out.jsonl")) as f:
        our_ids = json.loads(f.readline())["ids"]
    ref = json.loads(subprocess.run([sys.executable, "-c", HF, model_dir, str(args.threads), str(args.new),
                                     json.dumps(prompt)], capture_output=True, text=True, check=True).stdout)
    same = sum(a == b for a, b in zip(our_ids, ref["ids"]))
    print(f"model: Llama, {params / 1e6:.1f}M parameters, float32; prompt {args.prompt} tokens, {args.new} new, greedy, "
          f"batch 1, {args.threads} threads; ptrain KV cache {ours['cache']}")
    print(f"{'':14} {'prefill s':>10} {'decode tokens/s':>16} {'peak RSS MiB':>13}")
    print(f"{'ptrain':14} {ours['prefill_s']:>10.3f} {ours['decode_tps']:>16,.1f} {ours['peak_kib'] / 1024:>13,.0f}")
    print(f"{'transformers':14} {ref['prefill_s']:>10.3f} {ref['decode_tps']:>16,.1f} {ref['peak_kib'] / 1024:>13,.0f}")
    print(f"{'ptrain / HF':14} {ours['prefill_s'] / ref['prefill_s']:>10.2f} {ours['decode_tps'] / ref['decode_tps']:>16.2f} "
          f"{ours['peak_kib'] / ref['peak_kib']:>13.2f}")
    print(f"{'ceiling':14} {'':>10} {ref['floor_tps']:>16,.1f}   (the Linear weights' matrix-vector products alone: "
          f"{ref['weight_bytes'] / 1e6:,.0f} MB read per token at {ref['weight_bytes'] * ref['floor_tps'] / 1e9:.1f} GB/s; "
          f"{ref['floor_tps'] / ref['decode_tps']:.2f}x transformers' decode)")
    print(f"{'peak stream':14} {'':>10} {ref['stream_tps']:>16,.1f}   (the same bytes as one matrix-vector product: "
          f"{ref['weight_bytes'] * ref['stream_tps'] / 1e9:.1f} GB/s; {ref['stream_tps'] / ref['decode_tps']:.2f}x "
          f"transformers' decode, with nothing else per token)")
    print(f"generated ids equal: {same} of {args.new}\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
