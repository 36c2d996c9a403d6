#!/usr/bin/env python3
"""`ptrain export --gguf` checked by the readers people use: llama.cpp's own gguf-py and
transformers' GGUF loader.

Models: small random models of every family ptrain writes, made here with transformers (seeded)
beside a tokenizer of their kind — the fixtures' Llama 3-style byte-level BPE (hf_chat), their
Qwen2-style one (hf_qwen_chat), and a SentencePiece-style BPE (byte fallback, Metaspace: trained
here by HF tokenizers on the fortunes corpus, saved by transformers as its LlamaTokenizer): Llama
untied; Llama tied with a head_dim other than hidden / heads; Llama with attention biases and
linear RoPE scaling; Llama with Llama 3.1 RoPE scaling; Qwen2 with YaRN; Mistral; Llama with the SentencePiece
tokenizer; Mistral Nemo's shape with a Tekken-split byte-level BPE (tokenizer.ggml.pre "tekken", the
name llama.cpp's converter gives Mistral Nemo's); Qwen2 (tied, q/k/v biases); Qwen3 (q/k norms, head_dim 128 as released; and head_dim
32, tied). Each is exported in f32, f16, bf16 and q8_0 from a config naming it (model.hf_path);
one LoRA checkpoint is exported from --checkpoint (merged).

For every file:
  1. gguf-py (0.19.0) reads it: the architecture's hyperparameter keys equal config.json's; the
     tokens, token types, merges, special ids and chat template equal the tokenizer's; every
     tensor is there under llama.cpp's name, F32 where it is 1-D, its values equal the HF tensor
     — Llama's q/k rows permuted as llama.cpp's converter permutes them — exactly as f32, as
     torch rounds them to f16 / bf16, and as gguf-py's own Q8_0 quantizer writes them (bytes);
     Llama 3.1 scaling's rope_freqs equal the converter's formula; YaRN's type, factor and original
     context are the keys the converter writes;
  2. transformers' GGUF loader (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)) builds
     the model whose logits equal the HF model's with its weights as the file stores them (within
     1e-5 of the logits' scale; for f32 that is the original model, which ptrain equals on logits
     by the parity tests) — except where transformers' loader reads no RoPE scaling (it ignores
     rope_freqs and rope.scaling.*: those files are checked by gguf-py alone, said in the output);
     its tokenizer gives the HF tokenizer's ids on a test text;
  3. refusals by name, exit 2, no file left: a sliding window, MLP biases, YaRN that llama.cpp
     would run otherwise (beta_fast not 32; an attention factor not 0.1 ln(factor) + 1), a model
     directory without tokenizer.json; tokenizers llama.cpp would split or spell otherwise (not
     BPE, a pre-tokenizer it has no name for, a subword prefix, byte fallback without SentencePiece's
     pre-tokenizer, a token past the embedding's rows); a bitsandbytes NF4 directory, a GGUF
     base, no model.hf_path, lora.adapter_path set.

Usage: gguf_roundtrip.py PTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import torch

import gguf
from gguf.quants import quantize
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_run import run, train_chats  # noqa: E402

TEXT = "Hello world, it's 2024: 12345 tokens!\n\n  Ünïcode  ok? <|eot_id|> done"
TYPES = ["f32", "f16", "bf16", "q8_0"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"]


def make_sentencepiece_tokenizer(src, out):
    """A SentencePiece-style BPE as tokenizer.json holds Llama 2's and Mistral's (byte fallback, the
    256 byte tokens, Metaspace with prepend_scheme "first"), trained here by HF tokenizers on the
    fortunes corpus and saved by transformers as its LlamaTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    if os.path.exists(os.path.join(out, "tokenizer.json")):
        return out
    with open(os.path.join(src, "data/fortunes.txt")) as f:
        lines = f.read()[:200000].split("\n")
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False))
    LlamaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True,
                       legacy=False).save_pretrained(out)
    return out


# Mistral Nemo's Tekken split (its tekken.json's pattern, as transformers converts it into tokenizer.json).
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_tekken_tokenizer(src, out):
    """A byte-level BPE set up as transformers converts Mistral Nemo's tekken.json (Tekken's split,
    ByteLevel without its own regex, ignore_merges, <unk> <s> </s> first), trained here by HF
    tokenizers on the fortunes corpus."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if os.path.exists(os.path.join(out, "tokenizer.json")):
        return out
    with open(os.path.join(src, "data/fortunes.txt")) as f:
        lines = f.read()[:200000].split("\n")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(TEKKEN_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(out)
    return out


def cases(src, work):
    llama_tok, qwen_tok = os.path.join(src, "tests/fixtures/hf_chat"), os.path.join(src, "tests/fixtures/hf_qwen_chat")
    spm_tok = make_sentencepiece_tokenizer(src, os.path.join(work, "sentencepiece_tokenizer"))
    tekken_tok = make_tekken_tokenizer(src, os.path.join(work, "tekken_tokenizer"))
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    # The last field: why transformers' GGUF loader cannot stand in for llama.cpp on that model
    # (None: it can, and is compared).
    no_rope_scaling = "transformers' GGUF loader reads no RoPE scaling (rope_freqs, rope.scaling.*)"
    return [
        ("llama", llama_tok, dict(model_type="llama", tie_word_embeddings=False, **base), None),
        ("llama_tied_hd", llama_tok, dict(model_type="llama", tie_word_embeddings=True, head_dim=24, **base), None),
        ("llama_bias_linear", llama_tok,
         dict(model_type="llama", tie_word_embeddings=False, attention_bias=True,
              rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, **base),
         "transformers' GGUF loader reads neither Llama's attention biases nor RoPE scaling"),
        ("llama3_scaling", llama_tok,
         dict(model_type="llama", tie_word_embeddings=False,
              rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 32, "rope_theta": 500000.0}, **base),
         no_rope_scaling),
        ("qwen2_yarn", qwen_tok,
         dict(model_type="qwen2", tie_word_embeddings=True,
              rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                               "rope_theta": 1000000.0}, **base),
         no_rope_scaling),
        ("mistral_family", llama_tok, dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None, **base),
         None),
        ("llama_sentencepiece", spm_tok, dict(model_type="llama", tie_word_embeddings=False, **base), None),
        # Mistral Nemo's shape (head_dim above hidden / heads) and tokenizer kind: tokenizer.ggml.pre "tekken"
        ("mistral_nemo_tekken", tekken_tok,
         dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None, head_dim=32, **base), None),
        ("qwen2", qwen_tok, dict(model_type="qwen2", tie_word_embeddings=True, **base), None),
        # head_dim 128, as every released Qwen3 has it (above hidden / heads)
        ("qwen3", qwen_tok, dict(model_type="qwen3", tie_word_embeddings=False, head_dim=128, **base), None),
        ("qwen3_hd", qwen_tok, dict(model_type="qwen3", tie_word_embeddings=True, head_dim=32, **base),
         "transformers' GGUF loader reads no head_dim for Qwen3 (attention.key_length): it builds its config "
         "default, 128"),
    ]


def make_model(dir, tok_dir, cfg):
    os.makedirs(dir, exist_ok=True)
    tok_vocab = AutoTokenizer.from_pretrained(tok_dir)
    cfg = dict(cfg, vocab_size=len(tok_vocab))
    model_type = cfg.pop("model_type")
    torch.manual_seed(len(dir))
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # norms and biases away from 1 / 0, so a swap shows
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(dir)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tok_dir, f)):
            shutil.copy(os.path.join(tok_dir, f), dir)
    return model


def export(binary, work, model_dir, name, gguf_type):
    cfg = os.path.join(work, name + ".toml")
    with open(cfg, "w") as f:
        f.write(f'[model]\nhf_path = "{model_dir}"\n')
    out = os.path.join(work, f"{name}.{gguf_type}.gguf")
    run([binary, "export", "--gguf", out, "--gguf-type", gguf_type, "--config", cfg])
    return out


def permute(w, heads):  # llama.cpp's converter's permute(w, n_head)
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_names(cfg, n_layers):
    """HF name -> (GGUF name, heads to permute by or 0)."""
    llama = cfg.model_type in ("llama", "mistral")
    out = {"model.embed_tokens.weight": ("token_embd.weight", 0), "model.norm.weight": ("output_norm.weight", 0)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = ("output.weight", 0)
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for l in range(n_layers):
        for hf, g in parts.items():
            heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(g, 0) if llama else 0
            for kind in ("weight", "bias"):
                out[f"model.layers.{l}.{hf}.{kind}"] = (f"blk.{l}.{g}.{kind}", heads)
    return out


def stored(values, gguf_type):
    """The float32 values a file of gguf_type holds for a tensor, and its raw bytes where ptrain must
    match gguf-py's quantizer."""
    if values.ndim == 1 or gguf_type == "f32":
        return values.float(), None
    if gguf_type == "f16":
        return values.half().float(), None
    if gguf_type == "bf16":
        return values.bfloat16().float(), None
    if values.shape[-1] % 32:
        return values.half().float(), None  # Q8_0 cannot block these rows: written as F16
    q = quantize(values.numpy().astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)).reshape(values.shape), q


def check_file(path, model, tok_dir, gguf_type, failures):
    cfg = model.config
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("GGUF.")}
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}[cfg.model_type]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    want = {"general.architecture": arch, f"{arch}.block_count": cfg.num_hidden_layers,
            f"{arch}.embedding_length": cfg.hidden_size, f"{arch}.feed_forward_length": cfg.intermediate_size,
            f"{arch}.attention.head_count": cfg.num_attention_heads,
            f"{arch}.attention.head_count_kv": cfg.num_key_value_heads, f"{arch}.rope.dimension_count": head_dim,
            f"{arch}.context_length": cfg.max_position_embeddings, f"{arch}.vocab_size": cfg.vocab_size}
    for k, v in want.items():
        if f.get(k) != v:
            failures.append(f"{path}: {k} = {f.get(k)!r}, want {v!r}")
    if abs(f[f"{arch}.rope.freq_base"] - cfg.rope_parameters["rope_theta"]) > 1e-3 * cfg.rope_parameters["rope_theta"]:
        failures.append(f"{path}: rope.freq_base {f[f'{arch}.rope.freq_base']}")
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json")))
    vocab = {i: t for t, i in tj["model"]["vocab"].items()}
    vocab.update({a["id"]: a["content"] for a in tj["added_tokens"]})
    if f["tokenizer.ggml.tokens"] != [vocab[i] for i in range(cfg.vocab_size)]:
        failures.append(f"{path}: tokenizer.ggml.tokens differ from tokenizer.json's vocabulary")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    if f["tokenizer.ggml.merges"] != merges:
        failures.append(f"{path}: tokenizer.ggml.merges differ")
    sentencepiece = tj["model"].get("byte_fallback", False)
    is_byte = lambda t: sentencepiece and re.fullmatch(r"<0x[0-9A-F]{2}>", t) is not None  # noqa: E731
    special = {a["id"]: 6 if is_byte(a["content"]) else 2 if a["content"] == tj["model"].get("unk_token") and
               sentencepiece else 3 if a["special"] else 4 for a in tj["added_tokens"]}
    types = [special.get(i, 6 if is_byte(vocab[i]) else 1) for i in range(cfg.vocab_size)]
    if f["tokenizer.ggml.token_type"] != types:
        failures.append(f"{path}: token types differ")
    if f["tokenizer.ggml.model"] != ("llama" if sentencepiece else "gpt2"):
        failures.append(f"{path}: tokenizer.ggml.model {f['tokenizer.ggml.model']}")
    if sentencepiece:  # scores: minus the rank of the first merge making the token, below every merge else
        rank = {}
        for r_, m in enumerate(merges):
            rank.setdefault(m.replace(" ", ""), r_)
        want_scores = [-float(rank.get(vocab[i], len(merges) + i)) for i in range(cfg.vocab_size)]
        if f["tokenizer.ggml.scores"] != want_scores or f.get("tokenizer.ggml.add_space_prefix") is not True:
            failures.append(f"{path}: SentencePiece scores or add_space_prefix differ")
    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    for key, tok in (("bos", hf_tok.bos_token), ("eos", hf_tok.eos_token)):
        got = f.get(f"tokenizer.ggml.{key}_token_id")
        if got != (hf_tok.convert_tokens_to_ids(tok) if tok else None):
            failures.append(f"{path}: {key} id {got}, the tokenizer's {tok}")
    if f.get("tokenizer.chat_template") != hf_tok.chat_template:
        failures.append(f"{path}: chat template differs")
    pre = None if sentencepiece else "qwen2" if "qwen" in tok_dir else "tekken" if "tekken" in tok_dir else "llama-bpe"
    if f.get("tokenizer.ggml.pre") != pre:
        failures.append(f"{path}: tokenizer.ggml.pre {f['tokenizer.ggml.pre']}, want {pre}")

    tensors = {t.name: t for t in r.tensors}
    expected, file_values = set(), {}
    names = gguf_names(cfg, cfg.num_hidden_layers)
    for hf, value in model.state_dict().items():
        if hf not in names or (hf == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        g, heads = names[hf]
        expected.add(g)
        if g not in tensors:
            failures.append(f"{path}: no {g} (for {hf})")
            continue
        t = tensors[g]
        v = permute(value.detach(), heads) if heads else value.detach()
        want_values, want_bytes = stored(v, gguf_type)
        want_type = "F32" if v.ndim == 1 else {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}[gguf_type]
        if want_type == "Q8_0" and want_bytes is None:
            want_type = "F16"
        if t.tensor_type.name != want_type:
            failures.append(f"{path}: {g} is {t.tensor_type.name}, want {want_type}")
        got = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float().reshape(v.shape)
        if not torch.equal(got, want_values):
            failures.append(f"{path}: {g} values differ (max {(got - want_values).abs().max().item():.3g})")
        if want_bytes is not None and not np.array_equal(np.asarray(t.data).reshape(-1), want_bytes.reshape(-1)):
            failures.append(f"{path}: {g} Q8_0 bytes differ from gguf-py's quantizer")
        file_values[hf] = (heads, want_values)
    rope = cfg.rope_parameters
    if rope.get("rope_type") == "llama3":
        expected.add("rope_freqs.weight")
        freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim))
        low, high, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
        factors = []
        for fr in freqs:
            wl = 2 * np.pi / fr
            if wl < old / high:
                factors.append(1.0)
            elif wl > old / low:
                factors.append(rope["factor"])
            else:
                s = (old / wl - low) / (high - low)
                factors.append(1 / ((1 - s) / rope["factor"] + s))
        if not np.array_equal(tensors["rope_freqs.weight"].data, np.array(factors, dtype=np.float32)):
            failures.append(f"{path}: rope_freqs differ from the converter's formula")
    if set(tensors) != expected:
        failures.append(f"{path}: tensors {sorted(set(tensors) ^ expected)} unexpected or missing")
    if rope.get("rope_type") == "linear" and (f.get(f"{arch}.rope.scaling.type"), f.get(f"{arch}.rope.scaling.factor")) != ("linear", 2.0):
        failures.append(f"{path}: linear scaling keys missing")
    if rope.get("rope_type") == "yarn":  # the keys llama.cpp's converter writes, which llama.cpp reads
        got = tuple(f.get(f"{arch}.rope.scaling.{k}") for k in ("type", "factor", "original_context_length"))
        if got != ("yarn", rope["factor"], rope["original_max_position_embeddings"]):
            failures.append(f"{path}: YaRN scaling keys {got}")
    return file_values


def check_transformers(path, model, file_values, tok_dir, failures):
    """transformers' GGUF loader: its logits equal the HF model's with the file's values
    (`file_values`: {HF name: values in HF's row order})."""
    ref = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    state = model.state_dict()
    state.update(file_values)  # in HF's row order
    if model.config.tie_word_embeddings:  # one tensor: the output is the (stored) embedding
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    ref.load_state_dict(state, strict=False)
    if model.config.tie_word_embeddings:
        ref.tie_weights()
    loaded = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                  dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = loaded(ids).logits, ref(ids).logits
    err = (a - b).abs().max().item() / b.abs().max().item()
    if err > 1e-5:
        failures.append(f"{path}: transformers' GGUF model's logits differ by {err:.3g} of their scale")
    gguf_tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    hf_tok = AutoTokenizer.from_pretrained(tok_dir)
    if gguf_tok(TEXT).input_ids != hf_tok(TEXT).input_ids:
        failures.append(f"{path}: transformers' GGUF tokenizer ids differ from the HF tokenizer's")
    return err


def unpermute(w, heads):  # the inverse of permute
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_order(file_values):
    """check_file's {HF name: (heads, values in the file's row order)} as {HF name: values in HF's}."""
    return {hf: unpermute(v, h) if h else v for hf, (h, v) in file_values.items()}


def refusals(binary, work, src, failures):
    llama_tok = os.path.join(src, "tests/fixtures/hf_chat")
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256)
    bad = [("sliding", dict(model_type="mistral", sliding_window=16, **base), "sliding_window = 16"),
           ("mlp_bias", dict(model_type="llama", mlp_bias=True, **base), "mlp_bias = true"),
           ("yarn_beta", dict(model_type="qwen2", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                                   "original_max_position_embeddings": 64,
                                                                   "beta_fast": 16.0}, **base),
            "rope_scaling yarn beta_fast = 16.0"),
           ("yarn_attention", dict(model_type="qwen2", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                        "rope_theta": 1e6, "attention_factor": 1.0,
                                                                        "original_max_position_embeddings": 64}, **base),
            "rope_scaling yarn attention factor 1.0")]
    for name, cfg, message in bad:
        d = os.path.join(work, "bad_" + name)
        make_model(d, llama_tok, cfg)
        expect_refusal(binary, work, d, name, message, failures)
    d = os.path.join(work, "bad_no_tokenizer")
    make_model(d, llama_tok, dict(model_type="llama", **base))
    os.remove(os.path.join(d, "tokenizer.json"))
    expect_refusal(binary, work, d, "no_tokenizer", "no tokenizer.json in", failures)

    # Tokenizers llama.cpp would split or spell differently: one edit of a good tokenizer.json each.
    good = os.path.join(work, "bad_tokenizer_base")
    make_model(good, llama_tok, dict(model_type="llama", **base))

    def tokenizer_refusal(name, edit, message):
        d = os.path.join(work, "bad_" + name)
        shutil.copytree(good, d)
        with open(os.path.join(d, "tokenizer.json")) as f:
            tok = json.load(f)
        edit(tok)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
        expect_refusal(binary, work, d, name, message, failures)

    tokenizer_refusal("wordpiece", lambda t: t["model"].update(type="WordPiece"), "model type WordPiece is not BPE")
    tokenizer_refusal("pre_unnamed", lambda t: t.update(pre_tokenizer={"type": "WhitespaceSplit"}),
                      "is none llama.cpp names")
    tokenizer_refusal("subword_prefix", lambda t: t["model"].update(continuing_subword_prefix="##"),
                      "model.continuing_subword_prefix is set: llama.cpp's BPE has no such option")
    tokenizer_refusal("byte_fallback", lambda t: t["model"].update(byte_fallback=True),
                      "byte_fallback with a pre-tokenizer / normalizer other than SentencePiece's")
    tokenizer_refusal("token_past_rows", lambda t: t["added_tokens"].append(
        dict(t["added_tokens"][-1], id=5000, content="<|past|>")), "token id 5000 (<|past|>) is outside the model's")
    # What export --gguf --config does not take: a bitsandbytes NF4 directory, a GGUF base, a
    # seeded init, adapters beside the base.
    expect_refusal(binary, work, os.path.join(src, "tests/fixtures/hf_chat_bnb4"), "nf4_dir",
                   "quantization_config: bitsandbytes NF4 weights", failures,
                   extra='[lora]\nenabled = true\n[quant]\nbase = "nf4"\n')
    expect_refusal(binary, work, os.path.join(work, "llama.f32.gguf"), "gguf_base", "is a GGUF file already", failures)
    expect_refusal(binary, work, "", "no_hf_path", "model.hf_path is empty", failures)
    expect_refusal(binary, work, good, "adapter_path", "lora.adapter_path is set", failures,
                   extra=f'[lora]\nenabled = true\nadapter_path = "{good}"\n')


def expect_refusal(binary, work, model_dir, name, message, failures, extra=""):
    cfg = os.path.join(work, name + ".toml")
    with open(cfg, "w") as f:
        f.write(f'[model]\nhf_path = "{model_dir}"\n' + extra)
    out = os.path.join(work, name + ".gguf")
    r = subprocess.run([binary, "export", "--gguf", out, "--config", cfg], capture_output=True, text=True)
    if r.returncode != 2 or message not in r.stdout + r.stderr or os.path.exists(out):
        failures.append(f"{name}: want exit 2 naming '{message}' and no file; got rc {r.returncode}: "
                        f"{(r.stdout + r.stderr)[-400:]}")
    else:
        print(f"refused {name}: {message}")


def main():
    binary, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []
    for name, tok_dir, cfg, not_transformers in cases(src, work):
        model_dir = os.path.join(work, name)
        model = make_model(model_dir, tok_dir, cfg)
        for gguf_type in TYPES:
            path = export(binary, work, model_dir, name, gguf_type)
            before = len(failures)
            values = hf_order(check_file(path, model, model_dir, gguf_type, failures))
            note = "gguf-py: ok" if len(failures) == before else "gguf-py: FAILED"
            if not_transformers is None:
                err = check_transformers(path, model, values, model_dir, failures)
                note += f"; transformers' GGUF model: logits within {err:.2g} of their scale, tokenizer ids equal"
            else:
                note += f"; {not_transformers}: not compared there"
            print(f"{name} {gguf_type}: {os.path.getsize(path)} bytes; {note}")

    # A LoRA checkpoint (QLoRA on hf_chat), exported from --checkpoint: merged, then written.
    common, ckpt, _ = train_chats(binary, src, os.path.join(work, "lora"), os.path.join(src, "tests/fixtures/hf_chat"),
                                  steps=3, held_out_chats=1)
    merged = os.path.join(work, "lora", "merged")
    run([binary, "export", "--checkpoint", ckpt, "--out", merged, "--merge"])
    path = os.path.join(work, "lora", "merged_f32.gguf")
    run([binary, "export", "--checkpoint", ckpt, "--gguf", path, "--gguf-type", "f32"])
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    values = hf_order(check_file(path, model, merged, "f32", failures))
    err = check_transformers(path, model, values, merged, failures)
    print(f"LoRA checkpoint --gguf f32 = its --merge export through gguf-py and transformers (logits {err:.2g})")

    refusals(binary, work, src, failures)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
