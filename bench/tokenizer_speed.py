#!/usr/bin/env python3
"""Tokenizer throughput against tiktoken and HF `tokenizers`, on the same non-repetitive text,
with ids checked equal.

    $PTRAIN_VENV/bin/python bench/tokenizer_speed.py [PTRAIN_BIN] [--mib 32] [--vocab 32000] [--threads 1,2]

The text: the first MIB MiB of the Python sources of the venv's own packages (sorted paths,
concatenated; code and docstrings, no repetition). The tokenizer: a byte-level BPE set up as
Llama 3's (its split regex, `ignore_merges`), trained by HF `tokenizers` on the first eighth of
that text to VOCAB tokens and saved as tokenizer.json; tiktoken gets the same vocabulary as
mergeable ranks (a token's rank is its id, as in Llama 3's own tokenizer) and the same regex.
Each tokenizer encodes the whole text at 1 and at each thread count:
  ptrain      `ptrain tokenize --tokenizer DIR --threads N` (its own tokens/s: the encode,
              not the process start or reading the file)
  tiktoken    encode(text) at 1 thread, encode_batch(lines, num_threads=N), the tokenizer's added
              tokens as its special tokens, allowed in the text (as HF tokenizers and ptrain read
              them: Tekken's "<s>" in a Python regex is one token)
  HF          encode_batch(lines) with RAYON_NUM_THREADS=N
--tokenizer DIR runs a released tokenizer instead (tests/realfiles' sets: llama3.2-tokenizer,
qwen2.5-tokenizer, mistral-tekken-hf5, mistral-v3-hf5). tiktoken gets its split regex (a byte-level
BPE split by one regex, as Llama 3's, Qwen2's and Tekken's are); a SentencePiece-style one (Mistral
v3's, Llama 2's) is raced against HF tokenizers alone. Prints a table of tokens/s and ptrain's ratio to each; exit 1 when the ids differ. tiktoken is
installed into the venv on first use (pip, tiktoken==0.9.0).
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus(mib):
    site = os.path.dirname(os.path.dirname(os.__file__)) + "/site-packages"
    if not os.path.isdir(site):
        site = [p for p in sys.path if p.endswith("site-packages")][0]
    out, size = [], 0
    for path in sorted(glob.glob(site + "/**/*.py", recursive=True)):
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        size += len(text.encode())
        if size >= mib << 20:
            break
    # Characters newer than Python's Unicode tables (14.0, as Debian's PCRE2) are dropped: ptrain
    # refuses text holding them rather than risk splitting it otherwise than HF tokenizers.
    import unicodedata
    text = "".join(out)
    text = "".join(c for c in text if c < "\x80" or unicodedata.category(c) != "Cn")
    return text[: mib << 20]


def split_regex(tokenizer_json):
    """The split regex of a byte-level BPE whose pre-tokenizer is [Split(regex), ByteLevel without its
    own regex] (Llama 3, Qwen2, Tekken), which tiktoken runs with the same ranks; else None."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if (len(steps) == 2 and steps[0].get("type") == "Split" and "Regex" in steps[0].get("pattern", {})
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True)
            and tokenizer_json.get("normalizer") is None):
        return steps[0]["pattern"]["Regex"]
    return None


def run_ptrain(binary, tok_dir, text_path, threads, tmp):
    out = os.path.join(tmp, f"ptrain{threads}.bin")
    p = subprocess.run([binary, "tokenize", "--tokenizer", tok_dir, "--in", text_path, "--out", out, "--token-bytes", "4",
                        "--threads", str(threads)], capture_output=True, text=True, check=True)
    m = re.search(r"in ([0-9.]+) s: ([0-9,]+) tokens/s", p.stdout + p.stderr)
    rate = float(m.group(2).replace(",", ""))
    import numpy as np
    ids = np.frombuffer(open(out, "rb").read()[32:], dtype=np.uint32)
    return ids, rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "build/ptrain"))
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokenizer", help="a released tokenizer directory (e.g. the llama3.2-tokenizer set of "
                    "tests/realfiles/make_corpus.py) instead of training one")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    try:
        import tiktoken
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tiktoken==0.9.0"], check=True)
        import tiktoken
    import numpy as np
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tmp = tempfile.mkdtemp()
    text = corpus(args.mib)
    text_path = os.path.join(tmp, "corpus.txt")
    open(text_path, "w", encoding="utf-8").write(text)
    if args.tokenizer:
        tok_dir = args.tokenizer
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        print(f"text: {len(text.encode()) / 2**20:.1f} MiB of Python sources; tokenizer: {tok_dir}, "
              f"{tok.get_vocab_size():,} tokens ({len(tok.get_added_tokens_decoder())} added)")
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        t0 = time.time()
        tok.train_from_iterator(text[: len(text) // 8].split("\n"),
                                trainers.BpeTrainer(vocab_size=args.vocab, show_progress=False,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok_dir = os.path.join(tmp, "tok")
        os.makedirs(tok_dir)
        tok.save(os.path.join(tok_dir, "tokenizer.json"))
        print(f"text: {len(text.encode()) / 2**20:.1f} MiB of Python sources; tokenizer: byte-level BPE, "
              f"{tok.get_vocab_size():,} tokens, Llama 3's regex (trained in {time.time() - t0:.0f} s)")

    # GPT-2's byte-to-character map, inverted (the same table as src/tokenizer/tokenizer.cpp).
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    split = split_regex(json.loads(tok.to_str())) if args.tokenizer else LLAMA3_SPLIT
    if split:
        ranks = {bytes(chars[c] for c in token): i for token, i in tok.get_vocab(with_added_tokens=False).items()}
        added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
        enc = tiktoken.Encoding("bench", pat_str=split, mergeable_ranks=ranks, special_tokens=added)
    else:
        print("tiktoken: not run (not a byte-level BPE split by one regex)")

    rows, reference = [], None
    for t in threads:
        ids, rate = run_ptrain(args.binary, tok_dir, text_path, t, tmp)
        if reference is None:
            reference = ids
        rows.append((f"ptrain tokenize, {t} thread{'s' if t > 1 else ''}", len(ids), rate, bool((ids == reference).all())))
    lines = text.splitlines(keepends=True)
    for t in threads if split else []:
        t0 = time.time()
        if t == 1:
            ids = enc.encode(text, allowed_special="all")
        else:
            ids = [i for chunk in enc.encode_batch(lines, num_threads=t, allowed_special="all") for i in chunk]
        s = time.time() - t0
        # the batch encodes each line apart: a whitespace run across lines may split differently, so
        # only the whole-text encode is compared
        same = (len(ids) == len(reference) and bool((np.asarray(ids, dtype=np.uint32) == reference).all())) if t == 1 else None
        rows.append((f"tiktoken, {t} thread{'s' if t > 1 else ''}", len(ids), len(ids) / s, same))
    for t in threads:
        code = ("import os,sys,time;from tokenizers import Tokenizer;t=Tokenizer.from_file(sys.argv[1]);"
                "x=open(sys.argv[2],encoding='utf-8').read().splitlines(keepends=True);s=time.time();"
                "n=sum(len(e.ids) for e in t.encode_batch(x,add_special_tokens=False));print(n,time.time()-s)")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(tok_dir, "tokenizer.json"), text_path],
                             capture_output=True, text=True, check=True, env=dict(os.environ, RAYON_NUM_THREADS=str(t)))
        n, s = out.stdout.split()
        rows.append((f"HF tokenizers, {t} thread{'s' if t > 1 else ''}", int(n), int(n) / float(s), None))
    whole = tok.encode(text, add_special_tokens=False).ids  # HF's ids of the whole text, compared
    rows.append(("HF tokenizers, whole text", len(whole), float("nan"),
                 len(whole) == len(reference) and bool((np.asarray(whole, dtype=np.uint32) == reference).all())))
    ours = {t: r[2] for t, r in zip(threads, rows)}
    print(f"{'':28} {'tokens':>12} {'tokens/s':>12} {'ptrain/this (same threads)':>27} {'ids = ptrain':>13}")
    for name, count, rate, same in rows:
        m = re.search(r"(\d+) thread", name)
        ratio = f"{ours[int(m.group(1))] / rate:.2f}" if m else ""
        rate_s = f"{rate:,.0f}" if rate == rate else ""
        print(f"{name:28} {count:>12,} {rate_s:>12} {ratio:>27} {'' if same is None else str(same):>13}")
    sys.exit(0 if all(r[3] is not False for r in rows) else 1)


if __name__ == "__main__":
    main()
