#!/usr/bin/env python3
"""Tokenizer throughput: `ptrain tokenize --tokenizer DIR` against HF `tokenizers` on one text
file, side by side, and whether the ids are identical.

    $PTRAIN_VENV/bin/python bench/tokenizer_vs_hf.py [TEXT] [TOKENIZER_DIR] [PTRAIN_BIN]

Defaults: the repository's own sources and docs concatenated (no third-party text), the
fixture tokenizer (tests/fixtures/tokenizer_bpe, set up as Llama 3's), build/ptrain. Both run
on one thread: ptrain tokenizes the whole file in newline-cut chunks; HF gets the whole text
in one encode() (ids compared) and, for its usual speed, the lines through encode_batch with
RAYON_NUM_THREADS=1.
"""
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    tmp = tempfile.mkdtemp()
    text_path = sys.argv[1] if len(sys.argv) > 1 else None
    tok_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "tests/fixtures/tokenizer_bpe")
    binary = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "build/ptrain")
    if text_path is None:
        files = subprocess.check_output(["git", "ls-files", "*.md", "*.cpp", "*.h", "*.py", "*.sh"], cwd=ROOT, text=True).split()
        text_path = os.path.join(tmp, "corpus.txt")
        with open(text_path, "w", encoding="utf-8") as out:
            for f in files:
                out.write(open(os.path.join(ROOT, f), encoding="utf-8").read())
    out_path = os.path.join(tmp, "tokens.bin")
    t0 = time.time()
    subprocess.run([binary, "tokenize", "--tokenizer", tok_dir, "--in", text_path, "--out", out_path, "--token-bytes", "4"],
                   check=True, capture_output=True)
    ptrain_s = time.time() - t0  # includes process start and loading the tokenizer
    raw = open(out_path, "rb").read()
    ours = np.frombuffer(raw[32:], dtype=np.uint32)

    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    text = open(text_path, encoding="utf-8").read()
    t0 = time.time()
    ids = tok.encode(text, add_special_tokens=False).ids
    hf_whole_s = time.time() - t0
    lines = text.split("\n")
    t0 = time.time()
    batch_tokens = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
    hf_batch_s = time.time() - t0

    n = len(ids)
    print(f"text: {text_path} ({len(text.encode()) / 2**20:.1f} MiB), tokenizer: {tok_dir}")
    print(f"{'':32} {'tokens':>12} {'seconds':>9} {'tokens/s':>12} {'ptrain / this':>14}")
    rows = [("ptrain tokenize (whole process)", len(ours), ptrain_s),
            ("HF tokenizers encode(whole text)", n, hf_whole_s),
            ("HF tokenizers encode_batch(lines)", batch_tokens, hf_batch_s)]
    ours_rate = len(ours) / ptrain_s
    for name, count, s in rows:
        print(f"{name:32} {count:>12,} {s:>9.2f} {count / s:>12,.0f} {ours_rate / (count / s):>14.2f}")
    same = len(ours) == n and bool((ours == np.asarray(ids, dtype=np.uint32)).all())
    print("ids identical to HF encode(whole text):", same)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
