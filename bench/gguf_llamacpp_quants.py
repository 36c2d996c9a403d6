#!/usr/bin/env python3
"""GGUF files as llama.cpp's own quantizer writes them, read as the base (`model.hf_path`).

Release GGUFs are made by llama.cpp's `llama-quantize` (Q4_K_M, IQ4_XS, ...): each type's
blocks, the mix of types per tensor a preset chooses (Q4_K_M: Q4_K with Q6_K for some of the
attention values and FFN down projections, ...) and its fallbacks. This bench runs that quantizer
(`llama_model_quantize`, through the pinned llama-cpp-python wheel that bench/gguf_llamacpp.py
builds once from source) on a 256-wide random Llama and a Qwen2 (tests/sweep/gguf_import.py's
shapes, written in F32 by `ptrain export --gguf`) in each preset that needs no importance matrix,
and checks `ptrain eval` of every file against transformers' GGUF loader
(AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)) on the same windows. (The very-low-bit
presets — IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S — need an importance matrix, which the library call
cannot be given from Python; their block formats are checked against gguf-py by GgufReader.* and
sweep.gguf_import on random blocks.)

Then the Llama Q4_K_M file split into parts (gguf-py, as llama.cpp's gguf-split writes them):
llama.cpp's logits from the first part = from the whole file, and `ptrain eval` of the first part
with model.gguf_reader = "llama.cpp" = of the whole file.

Usage: bench/gguf_llamacpp_quants.py PTRAIN_BINARY WORK_DIR [--wheel FILE.whl]
Prints a table, one row per file: the types it holds, ptrain's and transformers' loss, their
relative difference; exits 1 where one differs by more than 2e-5.
"""
import argparse
import ctypes
import os
import sys

import gguf
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "sweep"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gguf_import import config, ptrain_eval, transformers_loss  # noqa: E402
from gguf_llamacpp import llama_cpp_module  # noqa: E402
from gguf_roundtrip import export, make_model  # noqa: E402
from shape_sweep import SEQ, write_tokens  # noqa: E402

# llama.cpp's presets (enum llama_ftype) that need no importance matrix
PRESETS = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_0", "Q4_1", "Q4_K_S", "Q4_K_M", "Q5_0", "Q5_1", "Q5_K_S",
           "Q5_K_M", "Q6_K", "Q8_0", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"]
WIDE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, max_position_embeddings=256,
            rms_norm_eps=1e-5)
FAMILIES = [("llama", "tests/fixtures/hf_chat", dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2,
                                                      tie_word_embeddings=False, **WIDE)),
            ("qwen2", "tests/fixtures/hf_qwen_chat", dict(model_type="qwen2", num_attention_heads=4,
                                                          num_key_value_heads=2, tie_word_embeddings=True, **WIDE))]


def quantize(llama_cpp, src, dst, preset):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({preset}) returned {rc}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("work")
    ap.add_argument("--wheel")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    llama_cpp = llama_cpp_module(a.wheel, a.work)
    quiet = llama_cpp.llama_log_callback(lambda level, text, data: None)  # kept alive while llama.cpp runs
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    g = torch.Generator().manual_seed(5)
    eval_ids = torch.randint(0, 558, (6 * (SEQ + 1),), generator=g).tolist()
    write_tokens(f"{a.work}/eval.bin", eval_ids, 558)
    write_tokens(f"{a.work}/train.bin", eval_ids, 558)  # the configs' data.path (eval reads --data)
    print(f"llama-cpp-python {llama_cpp.__version__}")
    print("| model | preset | types in the file | ptrain eval | transformers | relative |")
    print("|---|---|---|---|---|---|")
    worst, bad, read = 0.0, [], 0
    for name, tok, cfg in FAMILIES:
        model_dir = os.path.join(a.work, name)
        make_model(model_dir, os.path.join(ROOT, tok), cfg)
        f32 = export(a.binary, a.work, model_dir, name, "f32")
        for preset in PRESETS:
            d = os.path.join(a.work, f"{name}_{preset}")
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"{name}.{preset}.gguf")
            try:
                quantize(llama_cpp, f32, path, preset)
            except RuntimeError:  # the very-low-bit types some presets pick for small tensors
                print(f"| {name} | {preset} | (llama.cpp: needs an importance matrix for this model) | | | |")
                continue
            types = sorted({t.tensor_type.name for t in gguf.GGUFReader(path).tensors})
            got = ptrain_eval(a.binary, config(a.work, f"{name}_{preset}", path), f"{a.work}/eval.bin")
            want, _ = transformers_loss(path, eval_ids)
            rel = abs(got - want) / abs(want)
            read += 1
            worst = max(worst, rel) if rel == rel else float("inf")
            if not rel <= 2e-5:
                bad.append(f"{name} {preset}")
            print(f"| {name} | {preset} | {', '.join(types)} | {got:.6f} | {want:.6f} | {rel:.1e} |", flush=True)
    print(f"\n{read} files, largest relative difference {worst:.1e}"
          + (f"; differ: {', '.join(bad)}" if bad else ""))
    if not split_model(llama_cpp, a, os.path.join(a.work, "llama_Q4_K_M", "llama.Q4_K_M.gguf")):
        bad.append("split")
    sys.exit(1 if bad else 0)


def split_model(llama_cpp, a, path):
    """`path` split by gguf-py into parts of 8 tensors, its blocks copied as stored (as llama.cpp's
    gguf-split and its converter's --split-max-tensors write a split model): llama.cpp's logits from
    the first part = from the whole file, and `ptrain eval` with model.gguf_reader = "llama.cpp"
    of the first part = of the whole file."""
    d = os.path.join(a.work, "split")
    os.makedirs(d, exist_ok=True)
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(os.path.join(d, "llama.gguf"), arch=r.fields["general.architecture"].contents(),
                        split_max_tensors=8)
    for key, field in r.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(os.listdir(d))
    first = os.path.join(d, parts[0])
    prompt = list(range(5, 28))
    logits = []
    for p in (path, first):
        llm = llama_cpp.Llama(model_path=p, n_ctx=64, logits_all=True, n_threads=2, verbose=False)
        llm.eval(prompt)
        logits.append(torch.tensor(llm.scores[: len(prompt)]))
        del llm
    keys = 'gguf_reader = "llama.cpp"\n'
    got = ptrain_eval(a.binary, config(a.work, "split_first", first, model_keys=keys), f"{a.work}/eval.bin")
    whole = ptrain_eval(a.binary, config(a.work, "split_whole", path, model_keys=keys), f"{a.work}/eval.bin")
    same = torch.equal(logits[0], logits[1]) and got == whole
    print(f"\nsplit model ({os.path.basename(path)} in {len(parts)} parts of 8 tensors, gguf-py): llama.cpp's logits "
          f"{'=' if torch.equal(logits[0], logits[1]) else '!='} the whole file's; ptrain eval, model.gguf_reader = "
          f"\"llama.cpp\": {got:.7f} {'=' if got == whole else '!='} the whole file's {whole:.7f}")
    return same


if __name__ == "__main__":
    main()
