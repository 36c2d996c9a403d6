#!/usr/bin/env python3
"""llama.cpp itself runs what `ptrain export --gguf` writes: the round trip of issue "GGUF".

llama.cpp comes from the llama-cpp-python package (LLAMA_CPP_PYTHON, pinned), built from its
source distribution once — CPU only, no native tuning — into ~/.cache/ptrain/wheels and reused
from there, like the torch venv (the build takes tens of minutes on 2 cores: too slow for CI,
so this is a bench); --wheel names another build. For the
models of tests/sweep/gguf_roundtrip.py that llama.cpp runs as their family (every case; Llama 3.1
scaling through rope_freqs, linear scaling through rope.scaling.*), exported in f32 and f16:

  1. logits: llama.cpp's at every position of a 23-token prompt (logits_all) against the HF
     model's in float32 (= ptrain's, by the parity tests) with the file's weights (f16: the
     matrices rounded to f16): the largest difference relative to the largest logit — for f16
     files llama.cpp's CPU matmul also rounds the activations to f16;
  2. greedy: `ptrain generate` (greedy, float32) against llama.cpp's greedy continuation of the
     same prompt ids, 24 new tokens, on the same weights — the HF directory for the f32 file, the
     same with its matrices rounded to f16 for the f16 file: equal token for token, or the first
     position they part and ptrain's margin between its two best logits there.
llama.cpp keeps its KV cache in float32 here (type_k / type_v; its default, f16, alone moves the
logits by ~3e-4 of their scale).

Usage: bench/gguf_llamacpp.py PTRAIN_BINARY WORK_DIR [--wheel FILE.whl]
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "sweep"))
from gguf_roundtrip import cases, export, make_model  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

NEW_TOKENS = 24
TEXTS = ["Hello world", " leading space", "Hello  world\n\nNew paragraph", "What is 2+2? Four.",
         "ünïcödé 日本語 🙂", "def f(x):\n    return x*2", "  two spaces", "tab\there",
         "The quick brown fox jumps over the lazy dog. " * 3]
LLAMA_CPP_PYTHON = "0.3.36"
WHEELS = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptrain", "wheels")


def cached_wheel():
    """The pinned llama-cpp-python wheel, built into WHEELS the first time."""
    def found():
        return [f for f in os.listdir(WHEELS) if f.startswith(f"llama_cpp_python-{LLAMA_CPP_PYTHON}-")]
    os.makedirs(WHEELS, exist_ok=True)
    if not found():
        print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} from source into {WHEELS} (once; tens of minutes)",
              flush=True)
        env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2),
                   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary", "llama-cpp-python",
                        "-w", WHEELS, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True, env=env)
    return os.path.join(WHEELS, found()[0])


def llama_cpp_module(wheel, work):
    wheel = wheel or cached_wheel()
    if wheel:
        target = os.path.join(work, "llama_cpp_site")
        if not os.path.isdir(target):
            # its one requirement the venv lacks: diskcache (numpy, jinja2, typing-extensions are there)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel,
                            "diskcache==5.6.3"], check=True)
        sys.path.insert(0, target)
    import llama_cpp
    return llama_cpp


def ptrain_greedy(binary, work, model_dir, prompt):
    cfg = os.path.join(work, "generate.toml")
    with open(cfg, "w") as f:
        f.write(f'[model]\nhf_path = "{model_dir}"\n[data]\npath = "{ROOT}/data/fortunes.txt"\n'  # (unread)
                '[training]\ndevice = "cpu"\n[precision]\nmode = "fp32"\n')
    src, out = os.path.join(work, "prompt.jsonl"), os.path.join(work, "answer.jsonl")
    with open(src, "w") as f:
        f.write(json.dumps({"ids": prompt}) + "\n")
    subprocess.run([binary, "generate", "--config", cfg, "--in", src, "--out", out, "--max-new-tokens", str(NEW_TOKENS)],
                   check=True, capture_output=True)
    return json.loads(open(out).readline())["ids"]


def llama_cpp_greedy(llm, prompt, n):
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        if token == llm.token_eos():
            break
        llm.eval([token])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--wheel")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    llama_cpp = llama_cpp_module(a.wheel, a.work)
    print(f"llama-cpp-python {llama_cpp.__version__}")
    print("| model | type | logits: max diff / max logit | greedy (24 new tokens) |")
    print("|---|---|---|---|")
    worst = 0.0
    differing = 0
    for name, tok_dir, cfg, _ in cases(ROOT, a.work):
        model_dir = os.path.join(a.work, name)
        model = make_model(model_dir, tok_dir, cfg)
        prompt = torch.randint(0, model.config.vocab_size, (23,), generator=torch.Generator().manual_seed(7)).tolist()
        with torch.no_grad():
            want = model(torch.tensor([prompt])).logits[0].numpy()
        greedy_of = {"f32": ptrain_greedy(a.binary, a.work, model_dir, prompt)}
        # The f16 file's own weights (matrices rounded to f16) as an HF directory: what ptrain
        # generates from the values llama.cpp computes with.
        rounded = copy.deepcopy(model)
        with torch.no_grad():
            for p in rounded.parameters():
                if p.dim() == 2:
                    p.copy_(p.half().float())
        rounded.save_pretrained(model_dir + "_f16")
        for f in os.listdir(model_dir):
            if f.startswith("tokenizer") or f.endswith(".jinja"):
                shutil.copy(os.path.join(model_dir, f), model_dir + "_f16")
        greedy_of["f16"] = ptrain_greedy(a.binary, a.work, model_dir + "_f16", prompt)
        with torch.no_grad():
            want_of = {"f32": want, "f16": rounded(torch.tensor([prompt])).logits[0].numpy()}
        for gguf_type in ("f32", "f16"):
            mine, want = greedy_of[gguf_type], want_of[gguf_type]
            path = export(a.binary, a.work, model_dir, name, gguf_type)
            llm = llama_cpp.Llama(model_path=path, n_ctx=128, logits_all=True, n_threads=2, verbose=False,
                                  type_k=0, type_v=0)  # a float32 KV cache (its default is f16)
            llm.eval(prompt)
            got = np.array(llm.scores[: len(prompt)])
            err = float(np.abs(got - want).max() / np.abs(want).max())
            theirs = llama_cpp_greedy(llm, prompt, len(mine))
            if theirs == mine:
                greedy = f"equal ({len(mine)} tokens)"
            else:
                differing += 1
                i = next(i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y)
                with torch.no_grad():
                    logits = (model if gguf_type == "f32" else rounded)(torch.tensor([prompt + mine[:i]])).logits[0, -1]
                top = torch.topk(logits, 2).values
                greedy = f"part at token {i}: ptrain {mine[i]}, llama.cpp {theirs[i]} (ptrain's top-2 margin {float(top[0] - top[1]):.3g})"
            worst = max(worst, err) if gguf_type == "f32" else worst
            print(f"| {name} | {gguf_type} | {err:.2e} | {greedy} |")
            del llm
    print(f"worst f32 logits difference: {worst:.2e} of the largest logit; greedy runs that differ: {differing}")
    tokenization(llama_cpp, a)


def tokenization(llama_cpp, a):
    """llama.cpp's tokenizer on each exported vocabulary against transformers' tokenizer of the
    model directory (no special tokens added), on TEXTS; with the real Mistral v0.3 and Mistral
    Nemo (Tekken) tokenizers too when tests/realfiles has made them."""
    print("\n| tokenizer | texts with equal ids | where they differ |")
    print("|---|---|---|")
    dirs = [(name, os.path.join(a.work, name)) for name in ("llama", "qwen2", "llama_sentencepiece",
                                                            "mistral_nemo_tekken")]
    realfiles = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptrain", "realfiles")
    for label, set_name in (("Mistral v0.3 (released)", "mistral-v3-hf5"),
                            ("Mistral Nemo's Tekken (released, converted by transformers)", "mistral-tekken-hf5")):
        real = os.path.join(realfiles, set_name)
        if not os.path.exists(os.path.join(real, "tokenizer.json")):
            continue
        d = os.path.join(a.work, set_name.replace("-", "_") + "_tokenizer")
        tok = AutoTokenizer.from_pretrained(real)
        cfg = AutoConfig.for_model("mistral", vocab_size=len(tok), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, sliding_window=None)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        for f in os.listdir(real):
            if f.startswith("tokenizer"):
                shutil.copy(os.path.join(real, f), d)
        dirs.append((label, d))
    for name, d in dirs:
        path = export(a.binary, a.work, d, os.path.basename(d), "f16")
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        hf = AutoTokenizer.from_pretrained(d)
        differ = [t for t in TEXTS if llm.tokenize(t.encode(), add_bos=False, special=True) !=
                  hf(t, add_special_tokens=False).input_ids]
        print(f"| {name} | {len(TEXTS) - len(differ)} of {len(TEXTS)} | {', '.join(repr(t[:20]) for t in differ) or '—'} |")
        del llm


if __name__ == "__main__":
    main()
