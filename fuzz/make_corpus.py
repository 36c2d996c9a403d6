#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (fuzz/corpus/<target>/): small valid inputs of each kind the
readers take, and a few malformed ones, so that fuzzing starts from every branch's doorstep.
fuzz/corpus is written anew each run (from the fixtures as they are then); seeds written by hand
live in fuzz/seeds/<target>/ and crash inputs in fuzz/regressions/<target>/, which it leaves.

Run with the project's venv (safetensors):  $PTRAIN_VENV/bin/python fuzz/make_corpus.py
"""
import json
import os
import re
import shutil
import struct

import torch
from safetensors.torch import save

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")


def fuzz_targets():
    """The targets fuzz/targets.cmake lists."""
    with open(os.path.join(HERE, "targets.cmake")) as f:
        text = f.read()
    return re.search(r"set\(PTRAIN_FUZZ_TARGETS([^)]*)\)", text).group(1).split()


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds():
    put("safetensors", "f32_bf16_i64", save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                                             "b": torch.ones(3, dtype=torch.bfloat16),
                                             "c": torch.tensor([1, -2], dtype=torch.int64)}, {"format": "pt"}))
    put("safetensors", "empty_tensor_u8", save({"e": torch.zeros(0), "u": torch.arange(5, dtype=torch.uint8)}))
    put("safetensors", "scalar_f16", save({"s": torch.tensor(1.5, dtype=torch.float16)}))
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
    put("safetensors", "overlap", struct.pack("<Q", len(header)) + header + bytes(12))
    put("safetensors", "huge_header_length", struct.pack("<Q", 1 << 62) + b"{}")
    put("safetensors", "empty", b"")


def tokenizer_seeds():
    text = "Hello, world! 123 héllo\tworld  <|begin_of_text|>ünïcödé 你好 🙂 don't\n"
    for d in ("hf_chat", "hf_qwen_chat", "tokenizer_families/llama2", "tokenizer_families/mistral",
              "tokenizer_families/nfd", "tokenizer_families/normalizers", "tokenizer_families/qwen2"):
        with open(os.path.join(FIXTURES, d, "tokenizer.json"), "rb") as f:
            put("tokenizer", d.replace("/", "_"), f.read() + b"\0" + text.encode())
    # Texts with lines to cut at (the target checks every cut cuts_before allows), on every family.
    lines = "the model\nsays x = 12\n\nthe end.\n  indented\r\nwindows\n<tool_call>a\n\u4e2d\u6587\nthe model\n"
    for d in ("llama2", "mistral", "nfd", "normalizers", "qwen2", "crossing", "crossing_unk"):
        with open(os.path.join(FIXTURES, "tokenizer_families", d, "tokenizer.json"), "rb") as f:
            put("tokenizer", f"tokenizer_families_{d}_lines", f.read() + b"\0" + lines.encode())
    tiny = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                  "trim_offsets": True, "use_regex": True},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}}
    put("tokenizer", "tiny_bpe", json.dumps(tiny).encode() + b"\0abab")
    put("tokenizer", "wordpiece", json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}).encode() + b"\0a")


def jsonl_seeds():
    records = {
        "text": {"text": "The quick brown fox."},
        "messages": {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                                  {"role": "assistant", "content": "4"}]},
        "sharegpt": {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]},
        "alpaca": {"instruction": "Add", "input": "2 and 3", "output": "5"},
        "prompt_completion": {"prompt": "Capital of France?", "completion": " Paris"},
        "reasoning": {"messages": [{"role": "user", "content": "Why?"},
                                   {"role": "assistant", "content": "Because.", "reasoning_content": "think"}]},
        "bad_role": {"messages": [{"role": "wizard", "content": "x"}]},
        "pair_messages": {"prompt": [{"role": "user", "content": "2+2?"}],
                          "chosen": [{"role": "assistant", "content": "4"}],
                          "rejected": [{"role": "assistant", "content": "5"}]},
        "pair_implicit": {"chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                          "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}]},
        "pair_text": {"chosen": "Q: 2+2? A: 4 é", "rejected": "Q: 2+2? A: 5"},
        "kto_messages": {"prompt": [{"role": "user", "content": "2+2?"}],
                         "completion": [{"role": "assistant", "content": "5"}], "label": False},
        "kto_text": {"prompt": "Q: 2+2? A:", "completion": " 4", "label": 1},
        "not_an_object": [1, 2, 3],
        "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": [1.5e-05, -0.0, 1e16]}}}],
                  "messages": [{"role": "user", "content": "Call f"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                                   {"name": "f", "arguments": "{\"x\": 2}"}]},
                               {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                               {"role": "assistant", "content": "Done."}]},
    }
    for name, r in records.items():
        put("jsonl_record", name, json.dumps(r, ensure_ascii=False))
    put("jsonl_record", "truncated", '{"messages": [{"role": "user", "content": "unterminated')


def token_file_seeds():
    def tokens(version, width, count, vocab, ids, fmt):
        return b"PTRAINTK" + struct.pack("<IIQI", version, width, count, vocab) + bytes(4) + \
            b"".join(struct.pack(fmt, i) for i in ids)
    put("token_file", "u16", tokens(1, 2, 5, 300, [1, 2, 3, 299, 0], "<H"))
    put("token_file", "u32", tokens(1, 4, 3, 70000, [69999, 5, 0], "<I"))
    put("token_file", "count_past_end", tokens(1, 2, 9, 300, [1, 2], "<H"))
    put("token_file", "id_past_vocab", tokens(1, 2, 2, 10, [3, 11], "<H"))
    put("token_file", "bad_magic", b"NOTTOKEN" + bytes(24))


def checkpoint_meta_seeds():
    shape = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 160,
             "vocab_size": 1006, "max_seq_len": 256, "rope_theta": 500000.0, "norm_eps": 1e-5,
             "tie_embeddings": False, "family": "qwen3", "attention_bias": False, "mlp_bias": False,
             "sliding_window": 0, "rope_scaling": {"factor": 0.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_seq_len": 8192}}
    meta = {"format_version": 2, "step": 20, "samples": 640, "data": "rows:1234", "optimizer_steps": 20,
            "world_size": 2, "precision": "bf16", "master_dtype": "BFloat16", "lora": True,
            "lora_config": {"rank": 8, "alpha": 16.0, "dropout": 0.0, "rslora": False, "targets": ["q", "v"]},
            "shape": shape, "units": [{"name": "embed", "numel": 64384}, {"name": "block.0", "numel": 43136}],
            "files": {"model.rank0.safetensors": {"bytes": 1234, "crc32": "0badf00d"}}}
    put("checkpoint_meta", "lora_qwen3", json.dumps(meta, indent=2))
    yarn = dict(shape, rope_scaling={"type": "yarn", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_seq_len": 32768, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "truncate": True, "attention_factor": 1.1386})
    put("checkpoint_meta", "yarn", json.dumps(dict(meta, shape=yarn)))
    put("checkpoint_meta", "world_size_zero", json.dumps(dict(meta, world_size=0)))
    put("checkpoint_meta", "old_format", json.dumps(dict(meta, format_version=1)))
    put("checkpoint_meta", "not_json", "{\"format_version\": 2,")


def config_seeds():
    root = os.path.join(HERE, "..")
    for d in ("configs", os.path.join("tests", "configs", "bad")):
        for name in sorted(os.listdir(os.path.join(root, d))):
            if name.endswith(".toml"):
                with open(os.path.join(root, d, name), "rb") as f:
                    put("config", d.replace(os.sep, "_") + "_" + name, f.read())
    put("config", "yarn_keys", "[model]\npreset = \"qwen2_5_0_5b\"\nmax_seq_len = 131072\nrope_scaling_factor = 4.0\n"
        "rope_scaling_type = \"yarn\"\nrope_original_max_seq_len = 32768\n[data]\nseq_len = 64\n")
    put("config", "overrides_everything", "[model]\npreset = \"tiny\"\ndim = 96\nn_heads = 6\nn_kv_heads = 2\n"
        "[data]\nseq_len = 64\n[lora]\nenabled = true\ntargets = [\"q\", \"v\"]\n[quant]\nbase = \"nf4\"\n")


def hf_index_seeds():
    # The shards fuzz/hf_index.cpp writes beside the index: model-00001-of-00002 holds
    # model.embed_tokens.weight and model.norm.weight, model-00002-of-00002 lm_head.weight.
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    good = {"metadata": {"total_size": 80}, "weight_map": {"model.embed_tokens.weight": one,
                                                           "model.norm.weight": one, "lm_head.weight": two}}
    put("hf_index", "valid", json.dumps(good, indent=2))
    put("hf_index", "wrong_shard", json.dumps({"weight_map": dict(good["weight_map"], **{"lm_head.weight": one})}))
    put("hf_index", "left_out", json.dumps({"weight_map": {"model.embed_tokens.weight": one, "lm_head.weight": two}}))
    put("hf_index", "outside", json.dumps({"weight_map": dict(good["weight_map"], **{"x": "../" + two})}))
    put("hf_index", "missing_file", json.dumps({"weight_map": {"x": "model-00009-of-00009.safetensors"}}))
    put("hf_index", "not_a_map", json.dumps({"weight_map": [one, two]}))


def hf_config_seeds():
    # Every fixture model's config.json (each family, transformers 5's spelling), a transformers
    # 4.x one, and the kinds of config.json ptrain refuses by name.
    for d in sorted(os.listdir(FIXTURES)):
        path = os.path.join(FIXTURES, d, "config.json")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                put("hf_config", d, f.read())
    with open(os.path.join(FIXTURES, "hf_odd", "config.json")) as f:
        odd = json.load(f)
    rope = odd.pop("rope_parameters", None) or {}
    v4 = dict(odd, rope_theta=rope.get("rope_theta", 10000.0), transformers_version="4.46.0",
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16})
    put("hf_config", "llama3_rope_v4", json.dumps(v4, indent=2))
    put("hf_config", "yarn", json.dumps(dict(odd, rope_parameters={"rope_type": "yarn", "factor": 4.0})))
    put("hf_config", "yarn_every_key", json.dumps(dict(odd, rope_parameters={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 16, "beta_slow": 2,
        "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False, "rope_theta": 10000.0})))
    put("hf_config", "linear_v4", json.dumps(dict(v4, rope_scaling={"type": "linear", "factor": 2.0})))
    put("hf_config", "moe", json.dumps(dict(odd, model_type="mixtral", num_local_experts=8)))
    put("hf_config", "gptq", json.dumps(dict(odd, quantization_config={"quant_method": "gptq", "bits": 4})))
    put("hf_config", "huge_layers", json.dumps(dict(odd, num_hidden_layers=1 << 40)))
    put("hf_config", "not_an_object", "[1, 2]")


def peft_config_seeds():
    # ptrain's and PEFT's adapter configs of the fixtures, and target_modules in each form.
    for d in ("peft_tiny", "qlora_adapter") + tuple("peft_variants/" + v for v in
                                                   sorted(os.listdir(os.path.join(FIXTURES, "peft_variants")))):
        path = os.path.join(FIXTURES, d, "adapter_config.json")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                put("peft_config", d.replace("/", "_"), f.read())
    base = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0}
    put("peft_config", "regex", json.dumps(dict(base, target_modules=r"model\.layers\.\d+\.self_attn\.(q|v)_proj")))
    put("peft_config", "all_linear", json.dumps(dict(base, target_modules="all-linear")))
    put("peft_config", "some_layers", json.dumps(dict(base, target_modules=r".*layers\.[01]\..*q_proj")))
    put("peft_config", "dora", json.dumps(dict(base, target_modules=["q_proj"], use_dora=True)))
    # A sample of the PEFT differential's variants (read, refused by ptrain, refused by PEFT).
    with open(os.path.join(FIXTURES, "peft_config_variants.json"), encoding="utf-8") as f:
        for i, v in enumerate(json.load(f)["variants"]):
            if i % 12 == 0:
                put("peft_config", "variant_%03d_%s" % (i, re.sub(r"[^A-Za-z0-9_.]+", "_", v["name"])[:50]),
                    json.dumps(v["config"]))


def chat_template_seeds():
    # Every template of the chat fixtures (the family templates, their edits, other families', ...)
    # and the broken kinds ptrain refuses by name. The variants are generated by the build
    # (tests/fixtures/make_chat_template_variants.py): build/tests/, or $PTRAIN_CHAT_VARIANTS.
    path = os.environ.get("PTRAIN_CHAT_VARIANTS",
                          os.path.join(HERE, "..", "build", "tests", "chat_template_variants.json"))
    with open(path, encoding="utf-8") as f:
        variants = json.load(f)["variants"]
    # a one-edit variant is stored as a splice of its base's template's UTF-8 bytes
    bases = {v["name"]: v["template"].encode() for v in variants if "template" in v and v["base"] == v["name"]}
    for i, v in enumerate(variants):
        if v["must_read"] or i % 8 == 0:
            if "template" in v:
                template = v["template"].encode()
            else:
                start, end, text = v["splice"]
                template = bases[v["base"]][:start] + text.encode() + bases[v["base"]][end:]
            put("chat_template", "%03d_%s" % (i, re.sub(r"[^A-Za-z0-9_.]+", "_", v["name"])[:60]), template)
    put("chat_template", "unclosed_string", b"{{ 'a }}")
    put("chat_template", "unclosed_if", b"{% if messages %}{{ 'a' }}")
    put("chat_template", "raw_block", b"{% raw %}{{ x }}{% endraw %}")
    put("chat_template", "escapes", b"{{ '\\u00e9\\x41\\U0001F600\\q' }}")


def tokenizer_dir_seeds():
    # The four release-shaped directories of the tokenizer-directory fixtures, and a sample of their
    # tokenizer_config.json / config.json variants (read, rebuilt and refused ones).
    bases = {}
    for base in ("llama3", "llama2", "mistral", "qwen2"):
        with open(os.path.join(FIXTURES, "tokenizer_dirs", base, "tokenizer.json"), "rb") as f:
            bases[base] = f.read()
    with open(os.path.join(FIXTURES, "tokenizer_dir_variants.json"), encoding="utf-8") as f:
        variants = json.load(f)["variants"]
    for i, v in enumerate(variants):
        if i % 20 != 0 and v["name"] != "release" and not (v["files"] and i % 10 == 0):
            continue
        cfg = b"" if v["tokenizer_config"] is None else json.dumps(v["tokenizer_config"]).encode()
        model = b"" if v["config"] is None else json.dumps(v["config"]).encode()
        text = "\n".join(v.get("texts", ["hello world"])[:4]).encode()
        legacy = b""
        if v["files"]:
            legacy = b"".join(b"\0" + (json.dumps(v["files"][f]).encode() if f in v["files"] else b"")
                              for f in ("special_tokens_map.json", "added_tokens.json"))
        put("tokenizer_dir", "%03d_%s_%s" % (i, v["base"], re.sub(r"[^A-Za-z0-9_.]+", "_", v["name"])[:50]),
            cfg + b"\0" + model + b"\0" + bases[v["base"]] + b"\0" + text + legacy)


def json_array_seeds():
    # data.format = "json": records as one array, one line and pretty-printed, and broken arrays.
    with open(os.path.join(HERE, "..", "data", "tiny_chat.jsonl")) as f:
        records = [json.loads(line) for line in f][:3]
    put("json_array", "chats_indented", json.dumps(records, indent=2))
    put("json_array", "chats_one_line", json.dumps(records))
    put("json_array", "alpaca", json.dumps([{"instruction": "Add [1, 2].", "input": "", "output": "\"3\" ]\\"}]))
    put("json_array", "trailing_comma", "[{\"text\": \"a\"},]")
    put("json_array", "no_comma", "[{\"text\": \"a\"} {\"text\": \"b\"}]")
    put("json_array", "truncated", "[{\"text\": \"a")
    put("json_array", "jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n")


def parquet_seeds():
    # The Parquet fixtures, cut ones, and columns of every kind the reader converts (integers at
    # their limits, floats that are not finite, deep lists, structs with nulls, dictionaries).
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    d = os.path.join(FIXTURES, "parquet")
    for name in sorted(os.listdir(d)):
        if name.endswith(".parquet"):
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            put("parquet", name, data)
            put("parquet", "cut_" + name, data[: len(data) // 2])

    def table_bytes(table):
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()

    deep = pa.array([[1]], pa.list_(pa.int64()))
    for _ in range(40):
        deep = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), deep)
    put("parquet", "integers", table_bytes(pa.table({
        "u64": pa.array([0, 2**64 - 1, 2**63], pa.uint64()), "i64": pa.array([-2**63, 2**63 - 1, 0], pa.int64()),
        "f": pa.array([float("nan"), float("inf"), -0.0], pa.float64()), "b": pa.array([True, None, False])})))
    put("parquet", "nested", table_bytes(pa.table({"deep": deep})))
    put("parquet", "records", table_bytes(pa.table({
        "messages": pa.array([[{"role": "user", "content": "hi"}, None], None, []],
                             pa.large_list(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        "text": pa.array(["a", None, "c"], pa.large_string()),
        "cat": pa.array(["x", "y", "x"]).dictionary_encode(),
        "when": pa.array([0, 1, 2], pa.timestamp("s"))})))


def gguf_seeds():
    """The reader's fixture (every value type, every block type), a header alone, a file cut
    inside its tensor data, and a whole tiny model with each kind of tokenizer."""
    with open(os.path.join(FIXTURES, "gguf_blocks.gguf"), "rb") as f:
        blocks = f.read()
    put("gguf", "every_type", blocks)
    put("gguf", "cut_in_data", blocks[:len(blocks) - 700])
    put("gguf", "header_only", struct.pack("<IIQQ", 0x46554747, 3, 0, 0))
    kv = struct.pack("<Q", 17) + b"general.alignment" + struct.pack("<II", 4, 64)
    tensor = struct.pack("<Q", 1) + b"t" + struct.pack("<IQQIQ", 2, 32, 2, 8, 0)
    head = struct.pack("<IIQQ", 0x46554747, 3, 1, 1) + kv + tensor
    head += bytes(-len(head) % 64)
    put("gguf", "q8_0_aligned_64", head + bytes(68))
    for tokenizer in ("gpt2", "llama"):
        put("gguf", f"tiny_model_{tokenizer}", tiny_gguf_model(tokenizer))


def tiny_gguf_model(tokenizer):
    """A whole (tiny, tied) Llama as llama.cpp's converter lays it out, written by gguf-py, with a
    byte-level tokenizer and merges, or a SentencePiece one whose merges come from its scores."""
    import tempfile

    import gguf
    import numpy as np
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.gguf")
        w = gguf.GGUFWriter(path, arch="llama")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_rope_dimension_count(4)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model(tokenizer)
        if tokenizer == "gpt2":
            tokens = ["a", "b", "ab", "\u0120", "\u0120a", "<s>", "</s>", "<think>"]
            w.add_tokenizer_pre("llama-bpe")
            w.add_token_merges(["a b", "\u0120 a"])
        else:
            tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "ab", "\u2581a"]
            w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
        w.add_token_list(tokens)
        w.add_token_types([3 if t in ("<s>", "</s>") else 2 if t == "<unk>" else 4 if t == "<think>" else 1
                           for t in tokens])
        w.add_bos_token_id(tokens.index("<s>"))
        w.add_eos_token_id(tokens.index("</s>"))
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        shapes = {"token_embd.weight": (len(tokens), 8), "blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8),
                  "blk.0.attn_k.weight": (4, 8), "blk.0.attn_v.weight": (4, 8), "blk.0.attn_output.weight": (8, 8),
                  "blk.0.ffn_norm.weight": (8,), "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
                  "blk.0.ffn_down.weight": (8, 16), "output_norm.weight": (8,)}
        for name, shape in shapes.items():
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()


def torch_pickle_seeds():
    """data.pkl of torch.save archives: a module's state dict (an OrderedDict with _metadata), a plain
    dict in bfloat16, tensors sharing a storage and a transposed view, a Parameter, and names ptrain
    refuses (a function, a non-tensor value)."""
    import io
    import zipfile

    def pkl(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        z = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))

    torch.manual_seed(0)
    put("torch_pickle", "state_dict", pkl(torch.nn.Linear(4, 3).state_dict()))
    put("torch_pickle", "bf16_dict", pkl({"w": torch.randn(2, 8).bfloat16(), "b": torch.zeros(2, dtype=torch.int64)}))
    w = torch.randn(4, 6)
    put("torch_pickle", "shared_and_strided", pkl({"a": w, "tied": w, "t": w.t(), "row": w[1]}))
    put("torch_pickle", "parameter", pkl({"p": torch.nn.Parameter(torch.ones(3))}))
    put("torch_pickle", "not_a_tensor", pkl({"n": 3, "s": "x", "f": 1.5, "l": [1, (2, None)], "t": True}))
    put("torch_pickle", "a_function", pkl({"f": os.getcwd}))


def main():
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    safetensors_seeds()
    tokenizer_seeds()
    jsonl_seeds()
    token_file_seeds()
    checkpoint_meta_seeds()
    config_seeds()
    hf_index_seeds()
    hf_config_seeds()
    peft_config_seeds()
    chat_template_seeds()
    tokenizer_dir_seeds()
    parquet_seeds()
    json_array_seeds()
    gguf_seeds()
    torch_pickle_seeds()
    for target in fuzz_targets():
        d = os.path.join(HERE, "regressions", target)
        os.makedirs(d, exist_ok=True)
        keep = os.path.join(d, "README")
        if not os.listdir(d):
            with open(keep, "w") as f:
                f.write("Inputs that crashed fuzz_%s before their fix; ctest runs each (fuzz.%s.corpus).\n"
                        % (target, target))


if __name__ == "__main__":
    main()
