#!/usr/bin/env python3
"""`model.hf_path = "X.gguf"`: ptrain reads a GGUF model as transformers' GGUF loader reads it.

Models (gguf_roundtrip.py's cases, 64 wide: Llama untied; tied with head_dim 24; Mistral, which
llama.cpp's converter writes as Llama; Qwen2 tied with q/k/v biases; Qwen3 with head_dim 128),
exported by `ptrain export --gguf` in f32, f16, bf16 and q8_0; and one 256-wide model of each
llama.cpp architecture (llama, qwen2, qwen3) whose
exported tensors gguf-py re-encodes in every type ptrain reads, one type after another across the
tensors (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and BF16 / F16 quantized from the weights by gguf-py; the
K-quants Q2_K ... Q6_K, the i-quants IQ1_S ... IQ4_XS, TQ1_0, TQ2_0, MXFP4 and NVFP4, which gguf-py
cannot quantize, as random blocks with small scales).

For every file:
  1. `ptrain eval` with model.hf_path = the file equals, on the mean next-token loss of random
     windows, transformers' AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) (float32):
     the config built from the metadata, the dequantized tensors and Llama's q/k rows as
     transformers reads them;
  2. the 256-wide models (every type; a padding token id, which transformers makes the embedding's
     padding_idx) train: 3 steps in fp32 (each family) and of QLoRA (Llama) from the GGUF file give
     the losses of the same runs from the directory transformers' `save_pretrained` writes of its
     GGUF model's weights — the dequantized weights are the base, as they are in transformers;
     its exports (--merge, --gguf) carry the file's tokenizer and chat template (transformers' ids);
  1b. with model.gguf_reader = "llama.cpp", the files whose RoPE scaling or Llama attention biases
     transformers' loader drops (Llama 3.1's rope_freqs; linear scaling with biases) evaluate as the
     network of the directory they were written from: transformers' model of its config.json with
     the weights transformers reads from the file (1e-6); YaRN and Qwen3's other head widths are
     refused that way too;
  3. refusals, exit 2 naming the problem: what transformers' loader drops but llama.cpp computes
     with (Llama 3.1's rope_freqs, rope.scaling.type linear or yarn, a scaling factor without a
     type, Llama attention biases, Qwen3 heads other than 128 wide, keys wider than the heads,
     experts, each of the scales, soft-caps and clamps), a layer count past every model, a Llama
     named "mistral" (transformers builds Mistral, then fails; llama.cpp runs Llama), an
     architecture ptrain does not read, a tensor type it does not dequantize, a tensor left over or
     missing, per-layer head counts, a directory of two GGUF files, a split model's first part as
     transformers reads it, another part, a part missing (with model.gguf_reader = "llama.cpp" the
     parts gguf-py splits a file into read as the whole file); and chat data over a GGUF base
     without data.tokenizer checks with the file's tokenizer and chat template.

Usage: gguf_import.py PTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gguf_roundtrip import TEXT, TYPES, cases, export, make_model  # noqa: E402
from shape_sweep import SEQ, windows_loss, write_tokens  # noqa: E402

rng = np.random.default_rng(7)
CYCLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.BF16, Q.F16, Q.F32,
         Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0,
         Q.MXFP4, Q.NVFP4]
# Byte offsets of the float16 scales of each type gguf-py cannot quantize (IQ1_M's d is spread over
# its last four uint16's top nibbles; MXFP4 and NVFP4 have 8-bit scales), set small so the model
# stays sane; such tensors are random blocks.
RANDOM_BLOCKS = {Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
                 Q.IQ2_XXS: [0], Q.IQ2_XS: [0], Q.IQ2_S: [0], Q.IQ3_XXS: [0], Q.IQ3_S: [0], Q.IQ1_S: [0],
                 Q.IQ1_M: [], Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.TQ1_0: [52], Q.TQ2_0: [64], Q.MXFP4: [], Q.NVFP4: []}


def random_blocks(q, n):
    """n random blocks of type q with small scales: [n, bytes per block]."""
    block, size = gguf.GGML_QUANT_SIZES[q]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    small = lambda: (rng.standard_normal(n) * 3e-5).astype(np.float16)  # noqa: E731
    for off in RANDOM_BLOCKS[q]:
        raw[:, off:off + 2] = small().view(np.uint8).reshape(n, 2)
    if q == Q.IQ1_M:
        bits = small().view(np.uint16)
        words = raw[:, size - 8:].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12).astype(np.uint16)
        raw[:, size - 8:] = words.view(np.uint8)
    elif q == Q.MXFP4:
        raw[:, 0] = rng.integers(127 - 16, 127 - 12, size=n)  # E8M0: 2^-17 ... 2^-14
    elif q == Q.NVFP4:
        raw[:, :4] = rng.integers(1, 8, size=(n, 4))  # unsigned E4M3 subnormals: 2^-10 ... 7 * 2^-10
    return raw
PAD = 5  # the wide models' padding token id
passed = failed = 0


def check(ok, what):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok


def ptrain(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))


def config(work, name, model, extra="", model_keys=""):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(f'[run]\noutput_dir = "{work}/{name}_run"\nseed = 3\n[model]\nhf_path = "{model}"\n{model_keys}'
                f'[data]\npath = "{work}/train.bin"\nformat = "tokens"\nseq_len = {SEQ}\nmicro_batch_size = 2\n'
                'val_fraction = 0.0\n[training]\nsteps = 3\nlog_every = 1\neval_every = 0\ndevice = "cpu"\n'
                '[optimizer]\nlr = 1e-2\n[lr_schedule]\ndecay = "constant"\n' + extra)
    return path


def ptrain_eval(binary, cfg, data):
    p = ptrain([binary, "eval", "--config", cfg, "--data", data, "--json"])
    if p.returncode:
        print(p.stdout[-1500:] + p.stderr[-1500:])
        return math.nan
    return json.loads(p.stdout.strip().splitlines()[-1])["mean_loss"]


def transformers_loss(path, ids):
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    return windows_loss(model, ids), model


def source_network_loss(model_dir, path, ids, rope=None):
    """The mean loss of the network llama.cpp runs from `path`, a GGUF file written from `model_dir`:
    transformers' model of model_dir's config.json (its RoPE scaling and attention biases) with the
    weights transformers' GGUF loader reads from the file; the biases, which that loader drops, are
    model_dir's own (the file holds them in F32: the same values). `rope`: rope_parameters in place of
    model_dir's."""
    from_file = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                     dtype=torch.float32).state_dict()
    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = source.config
    if rope:
        cfg = type(cfg).from_dict({**cfg.to_dict(), "rope_parameters": rope})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    missing = model.load_state_dict(from_file, strict=False).missing_keys
    assert all(k.endswith(".bias") for k in missing), missing
    with torch.no_grad():
        for k in missing:
            model.get_parameter(k).copy_(source.get_parameter(k))
    return windows_loss(model, ids)


def close(a, b, tol=2e-5):
    return abs(a - b) <= tol * max(1.0, abs(b))


def requantize(src, dst, type_of=lambda name, i: None, meta=None, drop=(), extra=None, arch=None, split=0):
    """`src` (a GGUF file) rewritten by gguf-py: the i-th 2-D tensor re-encoded as type_of(name, i)
    says (None: as stored), metadata `meta` {key: (value, type, subtype)} set, tensors `drop` left out,
    `extra` {name: (raw, type)} added; `split` > 0: in parts of that many tensors (gguf-py's
    split_max_tensors, as llama.cpp's converter and gguf-split write a split model), the first
    part's path returned."""
    r = gguf.GGUFReader(src)
    arch = arch or r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch=arch, split_max_tensors=split)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in (meta or {}):
            continue
        sub = field.types[-1] if len(field.types) > 1 else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, (value, vtype, sub) in (meta or {}).items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    matrices = 0
    for t in r.tensors:
        if t.name in drop:
            continue
        shape = [int(d) for d in reversed(t.shape.tolist())]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        q = None
        if values.ndim == 2:
            q, matrices = type_of(t.name, matrices), matrices + 1
        if q is None or q == Q.F32:
            w.add_tensor(t.name, values)
        elif q == Q.F16:
            w.add_tensor(t.name, values.astype(np.float16))
        elif q in RANDOM_BLOCKS:
            raw = random_blocks(q, values.size // gguf.GGML_QUANT_SIZES[q][0])
            w.add_tensor(t.name, raw.reshape(shape[0], -1), raw_dtype=q)
        else:
            w.add_tensor(t.name, gguf.quants.quantize(values, q), raw_dtype=q)
    for name, (raw, q) in (extra or {}).items():
        w.add_tensor(name, raw, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split:
        parts = sorted(f for f in os.listdir(os.path.dirname(dst)) if f.startswith(os.path.basename(dst)[:-5] + "-"))
        return os.path.join(os.path.dirname(dst), parts[0])
    return dst


def types_in(path):
    return sorted({t.tensor_type.name for t in gguf.GGUFReader(path).tensors})


def expect_refusal(binary, cfg, message, what):
    p = ptrain([binary, "check", "--config", cfg])
    out = p.stdout + p.stderr
    check(p.returncode == 2 and message in out,
          f"refused {what}: exit {p.returncode}, names '{message}'" + ("" if message in out else f"\n{out[-1200:]}"))


def main():
    binary, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    g = torch.Generator().manual_seed(5)
    vocab = 558  # within both fixture tokenizers' vocabularies (hf_chat 1006, hf_qwen_chat 563)
    train = torch.randint(0, vocab, (4000,), generator=g)
    train[::4] = PAD  # in every batch: its embedding row must stay as it is
    write_tokens(f"{work}/train.bin", train.tolist(), vocab)
    eval_ids = torch.randint(0, vocab, (6 * (SEQ + 1),), generator=g).tolist()
    write_tokens(f"{work}/eval.bin", eval_ids, vocab)

    # 1. ptrain's own exports of every family, in the types it writes.
    refused = {"llama_bias_linear": "rope.scaling.type = \"linear\"", "llama3_scaling": "tensor rope_freqs.weight",
               "qwen2_yarn": "rope.scaling.type = \"yarn\"",
               "qwen3_hd": "Qwen3Config's default, 128"}
    # What transformers' loader drops, read as llama.cpp computes with it (model.gguf_reader =
    # "llama.cpp"): the network of the directory the file was written from.
    llama_cpp = 'gguf_reader = "llama.cpp"\n'
    read_as_llama_cpp = {"llama_bias_linear", "llama3_scaling"}
    refused_as_llama_cpp = {"qwen2_yarn": "rope.scaling.type = \"yarn\": RoPE scaling; ptrain reads llama.cpp's",
                            "qwen3_hd": "Qwen3Config's default, 128"}
    for name, tok_dir, cfg, _ in cases(src, work):
        if name == "llama_sentencepiece":
            continue  # a Llama of the same shape as "llama"; its tokenizer is realfiles.compare's (llama-spm)
        model_dir = os.path.join(work, name)
        make_model(model_dir, tok_dir, cfg)
        for gguf_type in TYPES:
            path = export(binary, work, model_dir, name, gguf_type)
            d = os.path.join(work, f"{name}_{gguf_type}")
            os.makedirs(d)
            shutil.move(path, d)  # a directory holding one GGUF file (and no config.json) names it too
            path = os.path.join(d, os.path.basename(path))
            cfg_path = config(work, f"{name}_{gguf_type}", d if gguf_type == "f16" else path)
            if name in refused:
                expect_refusal(binary, cfg_path, refused[name], f"{name} {gguf_type}")
                as_llama_cpp = config(work, f"{name}_{gguf_type}_llama_cpp", path, model_keys=llama_cpp)
                if name in refused_as_llama_cpp:
                    expect_refusal(binary, as_llama_cpp, refused_as_llama_cpp[name],
                                   f"{name} {gguf_type} as llama.cpp reads it")
                if name in read_as_llama_cpp:
                    got = ptrain_eval(binary, as_llama_cpp, f"{work}/eval.bin")
                    want = source_network_loss(model_dir, path, eval_ids)
                    # 1e-6: RoPE's scaling moves these random models' loss by ~1e-5 only
                    check(close(got, want, 1e-6), f"{name} {gguf_type}, model.gguf_reader = \"llama.cpp\": ptrain "
                          f"eval {got:.7f} = transformers' model of its source's config.json with the file's weights "
                          f"{want:.7f} ({abs(got - want) / want:.1e})")
                continue
            got = ptrain_eval(binary, cfg_path, f"{work}/eval.bin")
            want, _ = transformers_loss(path, eval_ids)
            check(close(got, want), f"{name} {gguf_type}: ptrain eval {got:.6f} = transformers' GGUF model {want:.6f}")

    # Llama 3.1 scaling with other bands than Llama 3.x's (low 2, high 5 over 64 positions) and two
    # divisors between them: llama.cpp's reading fits the bands to the file's rope_freqs.
    bands = os.path.join(work, "llama3_bands")
    make_model(bands, os.path.join(src, "tests/fixtures/hf_chat"),
               dict(model_type="llama", tie_word_embeddings=False, hidden_size=64, intermediate_size=96,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    max_position_embeddings=256, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 2.0,
                                     "high_freq_factor": 5.0, "original_max_position_embeddings": 64,
                                     "rope_theta": 500000.0}))
    path = export(binary, work, bands, "llama3_bands", "f32")
    got = ptrain_eval(binary, config(work, "llama3_bands", path, model_keys=llama_cpp), f"{work}/eval.bin")
    want = source_network_loss(bands, path, eval_ids)
    check(close(got, want, 1e-6), f"llama3_bands f32 (low 2, high 5 over 64 positions), model.gguf_reader = "
          f"\"llama.cpp\": ptrain eval {got:.7f} = its source's network {want:.7f} ({abs(got - want) / want:.1e})")

    # Trained from that file, as from its source directory (the same network and weights: the losses
    # within float32 rounding of RoPE's tables); its export's config.json gives transformers the
    # source's RoPE frequencies.
    losses = {}
    for source, model_path, keys in (("gguf", path, llama_cpp), ("source", bands, "")):
        run = f"train_llama3_bands_{source}"
        p = ptrain([binary, "--config", config(work, run, model_path, '[precision]\nmode = "fp32"\n', keys)])
        losses[source] = [json.loads(l)["loss"] for l in open(f"{work}/{run}_run/metrics.jsonl")
                          if '"loss"' in l] if p.returncode == 0 else (p.stdout + p.stderr)[-1500:]
    ok = isinstance(losses["gguf"], list) and len(losses["gguf"]) == 3 and all(
        close(a, b, 1e-6) for a, b in zip(losses["gguf"], losses["source"]))
    check(ok, f"llama3_bands: 3 fp32 steps from the GGUF file read as llama.cpp reads it = from its source "
          f"directory: {losses['gguf']} / {losses['source']}")
    exported = os.path.join(work, "llama3_bands_export")
    p = ptrain([binary, "export", "--checkpoint", f"{work}/train_llama3_bands_gguf_run/checkpoints/step_3",
                "--out", exported])
    if check(p.returncode == 0, "llama3_bands: a run from the file exports" + ("" if p.returncode == 0 else
                                                                               (p.stdout + p.stderr)[-1500:])):
        theirs = AutoModelForCausalLM.from_pretrained(exported).model.rotary_emb.inv_freq
        mine = AutoModelForCausalLM.from_pretrained(bands).model.rotary_emb.inv_freq
        rel = ((theirs - mine).abs() / mine).max().item()
        check(rel <= 1e-6, f"llama3_bands: transformers' RoPE frequencies of the export's config.json "
              f"({json.load(open(os.path.join(exported, 'config.json')))['rope_scaling']}) = the source's "
              f"(largest relative difference {rel:.1e})")

    # 2. A 256-wide model of each family in every type ptrain reads.
    wide = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=3, max_position_embeddings=256,
                rms_norm_eps=1e-5)
    families = [("llama", dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2,
                               tie_word_embeddings=False, **wide)),
                ("qwen2", dict(model_type="qwen2", num_attention_heads=4, num_key_value_heads=2,
                               tie_word_embeddings=True, **wide)),
                ("qwen3", dict(model_type="qwen3", num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                               tie_word_embeddings=False, **wide))]
    every_type = {}  # family -> (its GGUF file, transformers' model of it)
    for k, (name, cfg) in enumerate(families):
        tok = os.path.join(src, "tests/fixtures/hf_qwen_chat" if "qwen" in name else "tests/fixtures/hf_chat")
        model_dir = os.path.join(work, "wide_" + name)
        make_model(model_dir, tok, cfg)
        f32 = export(binary, work, model_dir, "wide_" + name, "f32")
        # A padding id, as releases have it: transformers makes it the embedding's padding_idx (no gradient).
        meta = {"tokenizer.ggml.padding_token_id": (PAD, V.UINT32, None)}
        path = requantize(f32, os.path.join(work, f"wide_{name}.gguf"), lambda _, i: CYCLE[(i + 3 * k) % len(CYCLE)],
                          meta=meta)
        got = ptrain_eval(binary, config(work, "wide_" + name, path), f"{work}/eval.bin")
        want, model = transformers_loss(path, eval_ids)
        check(close(got, want) and type(model).__name__.lower().startswith(name),
              f"wide {name} ({type(model).__name__}; {', '.join(types_in(path))}): ptrain eval {got:.6f} = "
              f"transformers' GGUF model {want:.6f}")
        every_type[name] = (path, model)
    covered = set().union(*(types_in(path) for path, _ in every_type.values()))
    check(covered >= {q.name for q in CYCLE}, f"the wide models hold every type ptrain reads ({len(covered)}: "
          f"missing {sorted({q.name for q in CYCLE} - covered)})")

    # 3. Training from the GGUF file = from transformers' save_pretrained of its GGUF model: every
    # family in fp32, Llama's QLoRA too.
    qlora = ('[lora]\nenabled = true\nrank = 4\nalpha = 8.0\n'
             'targets = ["q", "k", "v", "o", "gate", "up", "down"]\n'
             '[quant]\nbase = "nf4"\ndouble_quant = true\n[precision]\nmode = "bf16"\n')
    for name, (path, model) in every_type.items():
        saved = os.path.join(work, f"wide_{name}_saved")
        plain = model.config.to_dict()
        plain.pop("quantization_config", None)  # transformers saves no GGUF-loaded model: the same weights, plain
        plain_model = AutoModelForCausalLM.from_config(type(model.config).from_dict(plain), dtype=torch.float32)
        plain_model.load_state_dict(model.state_dict())
        plain_model.save_pretrained(saved)
        check(json.load(open(os.path.join(saved, "config.json"))).get("pad_token_id") == PAD,
              f"wide {name}: transformers' GGUF config takes tokenizer.ggml.padding_token_id as pad_token_id")
        modes = [("fp32", '[precision]\nmode = "fp32"\n')] + ([("qlora", qlora)] if name == "llama" else [])
        for mode, extra in modes:
            losses = {}
            for source, model_path in (("gguf", path), ("saved", saved)):
                run = f"train_{name}_{mode}_{source}"
                p = ptrain([binary, "--config", config(work, run, model_path, extra)])
                losses[source] = [json.loads(l)["loss"] for l in open(f"{work}/{run}_run/metrics.jsonl")
                                  if '"loss"' in l] if p.returncode == 0 else (p.stdout + p.stderr)[-1500:]
            check(losses["gguf"] == losses["saved"] and len(losses["gguf"]) == 3,
                  f"wide {name} {mode}: 3 steps from the GGUF file = from transformers' save_pretrained of it: "
                  f"{losses['gguf']} / {losses['saved']}")
    path = every_type["llama"][0]

    # The QLoRA run's exports carry the GGUF file's tokenizer as transformers saves it.
    ckpt = f"{work}/train_llama_qlora_gguf_run/checkpoints/step_3"
    merged, exported = os.path.join(work, "merged"), os.path.join(work, "merged.gguf")
    p = ptrain([binary, "export", "--checkpoint", ckpt, "--out", merged, "--merge"])
    q = ptrain([binary, "export", "--checkpoint", ckpt, "--gguf", exported, "--gguf-type", "f32"])
    if check(p.returncode == 0 and q.returncode == 0, "a run from a GGUF base exports (--merge, --gguf)"
             + ("" if p.returncode == q.returncode == 0 else (p.stdout + p.stderr + q.stdout + q.stderr)[-1500:])):
        from transformers import AutoTokenizer
        want = AutoTokenizer.from_pretrained(work, gguf_file=os.path.basename(path))(TEXT).input_ids
        got = AutoTokenizer.from_pretrained(merged)(TEXT).input_ids
        again = AutoTokenizer.from_pretrained(work, gguf_file=os.path.basename(exported))(TEXT).input_ids
        check(got == want and again == want and
              AutoTokenizer.from_pretrained(merged).chat_template == gguf.GGUFReader(path).fields[
                  "tokenizer.chat_template"].contents(),
              "its exports' tokenizer and chat template = the GGUF file's (transformers, on ids)")

    # 4. Refusals.
    base = os.path.join(work, "llama_f32", "llama.f32.gguf")
    bad = os.path.join(work, "bad")
    os.makedirs(bad)

    def refusal(name, message, what, model_keys="", **kw):
        expect_refusal(binary, config(work, "bad_" + name, requantize(base, os.path.join(bad, name + ".gguf"), **kw),
                                      model_keys=model_keys), message, what)

    # A split model (gguf-py's parts of 5 tensors): read from its first part as llama.cpp reads it,
    # = the whole file; transformers' loader reads the first part alone (the rest left at random):
    # refused that way; another part, or a part missing, refused naming the part.
    split_dir = os.path.join(work, "split")
    os.makedirs(split_dir)
    first = requantize(base, os.path.join(split_dir, "llama.gguf"), split=5)
    parts = sorted(os.listdir(split_dir))
    got = ptrain_eval(binary, config(work, "split_llama_cpp", first, model_keys=llama_cpp), f"{work}/eval.bin")
    want = ptrain_eval(binary, config(work, "whole_llama_cpp", base, model_keys=llama_cpp), f"{work}/eval.bin")
    check(len(parts) > 2 and got == want, f"a split model in {len(parts)} parts, model.gguf_reader = \"llama.cpp\": "
          f"ptrain eval {got:.7f} = the whole file's {want:.7f}")
    got = ptrain_eval(binary, config(work, "split_dir", split_dir, model_keys=llama_cpp), f"{work}/eval.bin")
    check(got == want, f"a directory holding the parts names the first: {got:.7f}")
    expect_refusal(binary, config(work, "split_transformers", first), "the first of " + str(len(parts)) +
                   " parts of a split model", "a split model's first part, as transformers' loader reads it")
    expect_refusal(binary, config(work, "split_second", os.path.join(split_dir, parts[1]), model_keys=llama_cpp),
                   "part 2 of " + str(len(parts)) + " of a split model; name its first part, " + first,
                   "a split model's second part")
    os.remove(os.path.join(split_dir, parts[-1]))
    expect_refusal(binary, config(work, "split_missing", first, model_keys=llama_cpp),
                   os.path.join(split_dir, parts[-1]) + ", is missing", "a split model with a part missing")

    refusal("gemma", 'general.architecture "gemma"', "an architecture ptrain does not read", arch="gemma")
    # Q8_1 (two blocks of 32 a row): ggml's dot-product intermediate, which gguf-py cannot dequantize
    q8_1 = rng.integers(0, 256, size=(1006, 2 * gguf.GGML_QUANT_SIZES[Q.Q8_1][1]), dtype=np.uint8)
    refusal("q8_1", "Q8_1, which ptrain does not dequantize", "a tensor type it does not read",
            drop={"output.weight"}, extra={"output.weight": (q8_1, Q.Q8_1)})
    refusal("extra", "tensor 'blk.0.extra.weight' is not part of", "a tensor left over",
            extra={"blk.0.extra.weight": (np.zeros((4, 64), np.float32), Q.F32)})
    refusal("attn_bias", "(attention biases: transformers' GGUF loader builds Llama without them",
            "Llama attention biases", extra={"blk.0.attn_q.bias": (np.zeros(64, np.float32), Q.F32)})
    refusal("missing", "tensor 'blk.1.ffn_up.weight' (model.layers.1.mlp.up_proj.weight, [96, 64]) is missing",
            "a missing tensor", drop={"blk.1.ffn_up.weight"})
    refusal("kv_per_layer", "llama.attention.head_count_kv is array of u32", "per-layer head counts",
            meta={"llama.attention.head_count_kv": ([2, 2], V.ARRAY, V.UINT32)})
    # llama.cpp's converter names a Mistral by its model card ("Mistral 7B ..."): transformers builds
    # it as Llama. Named exactly "mistral", transformers builds MistralConfig and then fails (gguf-py
    # has no "mistral" tensor map); llama.cpp runs it as Llama.
    refusal("named_mistral", 'general.name "mistral"', "a Llama GGUF named \"mistral\"",
            meta={"general.name": ("mistral", V.STRING, None)})
    refusal("experts", "mixture-of-experts", "experts", meta={"llama.expert_count": (8, V.UINT32, None)})
    # The other keys llama.cpp computes with and transformers' loader drops, each at a value that
    # changes the network (the neutral ones, 0 or 1, are read as nothing).
    for key, message in (("logit_scale", "the logits scaled"), ("embedding_scale", "the embeddings scaled"),
                         ("residual_scale", "the residual branches scaled"),
                         ("attention.scale", "an attention scale other than 1/sqrt(head_dim)"),
                         ("attn_logit_softcapping", "attention logits soft-capped"),
                         ("final_logit_softcapping", "the output logits soft-capped"),
                         ("attention.clamp_kqv", "q/k/v clamped")):
        refusal(key.replace(".", "_"), f"llama.{key} = 0.5", message, meta={f"llama.{key}": (0.5, V.FLOAT32, None)})
    refusal("scaling_factor", "llama.rope.scaling.factor = 4.0: RoPE scaling", "a RoPE scaling factor without a type",
            meta={"llama.rope.scaling.factor": (4.0, V.FLOAT32, None)})
    # As llama.cpp reads them: a factor without a type is its default, linear scaling.
    p = requantize(base, os.path.join(bad, "linear_untyped.gguf"), meta={"llama.rope.scaling.factor": (4.0, V.FLOAT32, None)})
    got = ptrain_eval(binary, config(work, "linear_untyped", p, model_keys=llama_cpp), f"{work}/eval.bin")
    want = source_network_loss(os.path.join(work, "llama"), p, eval_ids,
                               rope={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    check(close(got, want, 1e-6), f"a RoPE scaling factor without a type, as llama.cpp reads it (linear): ptrain "
          f"eval {got:.7f} = transformers with linear scaling by 4 {want:.7f} ({abs(got - want) / want:.1e})")
    # ... and what ptrain does not build that way, refused naming it.
    refusal("bias_q_only", "tensor 'blk.0.attn_k.bias' (model.layers.0.self_attn.k_proj.bias, [32]) is missing",
            "as llama.cpp reads it: attention biases on q alone", model_keys=llama_cpp,
            extra={"blk.0.attn_q.bias": (np.zeros(64, np.float32), Q.F32)})
    refusal("rope_freqs_other", "these frequency divisors are not Llama 3.1's scaling",
            "as llama.cpp reads it: rope_freqs of another form than Llama 3.1's", model_keys=llama_cpp,
            extra={"rope_freqs.weight": (np.array([1, 3, 2, 5, 4, 8, 7, 6], np.float32), Q.F32)})
    refusal("attn_factor", "llama.rope.scaling.attn_factor = 0.5: RoPE's cos and sin scaled",
            "as llama.cpp reads it: RoPE's attention factor", model_keys=llama_cpp,
            meta={"llama.rope.scaling.attn_factor": (0.5, V.FLOAT32, None)})
    refusal("freqs_and_linear", "rope_freqs.weight and linear RoPE scaling by 2.0: llama.cpp applies both",
            "as llama.cpp reads it: rope_freqs with linear scaling", model_keys=llama_cpp,
            meta={"llama.rope.scaling.factor": (2.0, V.FLOAT32, None)},
            extra={"rope_freqs.weight": (np.full(8, 4.0, np.float32), Q.F32)})
    refusal("rope_freqs_below_one", "tensor rope_freqs.weight holds 0.5: Llama 3.1's divisors are finite and at "
            "least 1", "as llama.cpp reads it: a divisor below 1", model_keys=llama_cpp,
            extra={"rope_freqs.weight": (np.array([1, 1, 1, 0.5, 4, 4, 4, 4], np.float32), Q.F32)})
    refusal("rope_freqs_shape", "tensor rope_freqs.weight has shape [4]; llama.cpp reads one divisor per rotated "
            "pair, [8]", "as llama.cpp reads it: rope_freqs of the wrong length", model_keys=llama_cpp,
            extra={"rope_freqs.weight": (np.full(4, 4.0, np.float32), Q.F32)})
    qwen2 = os.path.join(work, "qwen2_f32", "qwen2.f32.gguf")
    expect_refusal(binary, config(work, "bad_qwen2_rope_freqs", requantize(
        qwen2, os.path.join(bad, "qwen2_rope_freqs.gguf"),
        extra={"rope_freqs.weight": (np.full(8, 4.0, np.float32), Q.F32)}), model_keys=llama_cpp),
        "tensor rope_freqs.weight: llama.cpp's qwen2 architecture does not read it",
        "as llama.cpp reads it: rope_freqs on qwen2")
    refusal("key_length", "llama.attention.key_length = 32 but the config transformers builds has heads 16 wide",
            "keys wider than the heads transformers builds", meta={"llama.attention.key_length": (32, V.UINT32, None)})
    refusal("block_count", "llama.block_count = 100000 is outside [1, ", "a layer count past every model",
            meta={"llama.block_count": (100000, V.UINT32, None)})
    two = os.path.join(work, "two")
    os.makedirs(two)
    for n in ("a.gguf", "b.gguf"):
        shutil.copy(base, os.path.join(two, n))
    expect_refusal(binary, config(work, "two", two), "holds 2 GGUF files", "a directory of two GGUF files")

    # Chat data over a GGUF base without data.tokenizer: the file's tokenizer and chat template.
    chats = os.path.join(work, "chats.jsonl")
    with open(chats, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
                + "\n")
    cfg = config(work, "chat", base)
    with open(cfg) as f:
        text = f.read().replace(f'path = "{work}/train.bin"\nformat = "tokens"', f'path = "{chats}"\nformat = "jsonl"')
        text = text.replace(f"seq_len = {SEQ}", "seq_len = 128")  # the Llama 3 template's header is longer
    with open(cfg, "w") as f:
        f.write(text)
    p = ptrain([binary, "check", "--config", cfg])
    check(p.returncode == 0 and "tokenizer.chat_template" in p.stdout + p.stderr,
          "chat data over a GGUF base: its tokenizer and chat template read from the file"
          + ("" if p.returncode == 0 else f"\n{(p.stdout + p.stderr)[-1200:]}"))

    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
