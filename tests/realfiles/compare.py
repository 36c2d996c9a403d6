#!/usr/bin/env python3
"""ptrain against transformers on the real-files corpus (tests/realfiles/make_corpus.py).

    $PTRAIN_VENV/bin/python tests/realfiles/compare.py PTRAIN_BIN [CORPUS] [--only NAME,...] [--all-gguf-vocabs]

For every set of the corpus:
  tokenizer   `ptrain tokenize --tokenizer DIR` on a mixed text (English, code, numbers, CJK,
              accents, emoji, runs of spaces and newlines, the tokenizer's own special tokens
              written in the text) = AutoTokenizer(DIR).encode(text, add_special_tokens=False);
              and on 240 copies of it with every kind of line end between them, cut into 1 KiB
              chunks where ptrain may cut, 2 threads = the same encode of the whole
  check       (model directories) `ptrain check` reads the directory (exit 0), and which
              config.json / tokenizer_config.json keys it ignores as transformers does
  eval        (model directories) `ptrain eval --json` in fp32 on windows of that text = the mean
              cross-entropy transformers' AutoModelForCausalLM gives the same windows (relative
              difference <= 1e-5)
  gguf        (GGUF files: llama.cpp's converted Llama 3, Llama 2 and Qwen2 vocabularies; the released
              SmolLM2-135M-Instruct Q4_1) `ptrain tokenize --tokenizer FILE` = transformers'
              AutoTokenizer.from_pretrained(dir, gguf_file=...) on the mixed text; for the model,
              `ptrain eval` with model.hf_path = the file = transformers' from_pretrained(dir,
              gguf_file=...) on the same windows (1e-5); llama.cpp's converter's Q8_0 file of a Llama
              3.2-shaped directory (its RoPE scaling as rope_freqs.weight) with model.gguf_reader =
              "llama.cpp" = transformers' model of that directory's config.json with the weights
              transformers reads from the file
  export      (hf5-mistral-nemo) `ptrain export --gguf` of the directory: transformers' GGUF
              tokenizer of the file and `ptrain tokenize` of it = the directory's ids on the mixed text
  chat        (model directories with a ChatML template: SmolLM2, Qwen2.5's) `ptrain eval` of
              three chats as JSONL = transformers' loss over the replies of the same chats rendered
              by apply_chat_template (labels -100 but for each reply through its <|im_end|> and
              newline, as tests/fixtures/make_chat_template_fixtures.py marks them): the same
              number of trained tokens, the loss within 1e-4 (as sweep.chat_roundtrip)
  sft text    (every tokenizer, GGUF ones too) text records — {"text"} documents and string
              {"prompt", "completion"} pairs: text ending with the eos_token or holding it, a prompt
              ending with a space, newlines merging across the prompt's end, an empty prompt — as
              `ptrain check` tokenizes them into its sample cache (ids and trained tokens) = TRL's
              SFTTrainer train dataset (input_ids, labels) of the same records
  templates   (the released chat templates of the chat-templates set, each with the corpus model of
              its model's family — Mistral Nemo's and Devstral's with the Tekken one —, else Qwen2's; and the
              template transformers attaches to a converted Tekken vocabulary) `ptrain eval` of CHATS and a chat with reasoning =
              transformers' loss over the replies as apply_chat_template renders them (as chat), or
              ptrain refuses the template naming its file; the templates of Llama 3.1 / 3.2 / 3.3
              Instruct, Qwen2.5, Qwen3, QwQ, Mistral Nemo, Devstral Small 2507 and DeepSeek-R1's
              distills, and the one transformers attaches to a converted Tekken vocabulary, must render
  tool-chats  chats with tools, tool calls and tool results (tests/fixtures/make_tool_chat_fixtures.py's
              records) as JSONL: with Qwen2.5's released template over hf5-qwen2 (the real Qwen2.5
              tokenizer), Qwen3's first release over hf5-qwen3 and Llama 3.1's, 3.2's and 3.3's over
              hf5-llama (the Llama 3.2 tokenizer) and Mistral Nemo's over hf5-mistral-nemo (its Tekken
              tokenizer) `ptrain eval` = transformers' loss over the replies as
              apply_chat_template(messages, tools=...) renders them, each chat the template raises on
              (or ptrain refuses knowingly) refused; QwQ's refuses them
Prints one table row per set and per template; exit 1 on any refusal or difference.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
from make_chat_template_fixtures import labels_of  # noqa: E402  (the chat fixtures' reference mask)
from make_tool_chat_fixtures import (  # noqa: E402  (chats with tools)
    LLAMA_RECORDS, LLAMA_REFUSED, LLAMA_REPLY, NEMO_RECORDS, NEMO_REFUSED, NEMO_REPLY, QWEN3_RECORDS, QWEN_REPLY,
    RECORDS as TOOL_RECORDS, reply_labels)

CHATS = [
    [{"role": "user", "content": "What is 12 × 34?"}, {"role": "assistant", "content": "12 × 34 = 408."}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Japan?"},
     {"role": "assistant", "content": "Tokyo — 東京."}],
    [{"role": "user", "content": "  List: a, b  "}, {"role": "assistant", "content": "1. a\n2. b\n"}],
]
SEQ = 96
# Released GGUF files read as model.hf_path (`ptrain eval` = transformers' GGUF loader), with the
# set holding their tokenizer as transformers builds it from the file.
GGUF_FILES = {"smollm2-135m-gguf": "wheels/smollm2/model.gguf", "llamacpp-llama3.2-gguf": "llamacpp-llama3.2/model.q8_0.gguf"}
# GGUF files read as llama.cpp reads them (model.gguf_reader = "llama.cpp"), each with the directory
# llama.cpp's converter wrote it from: the reference is transformers' model of that directory's
# config.json (its RoPE scaling, which transformers' GGUF loader drops) with the weights transformers
# reads from the file.
LLAMA_CPP_READ = {"llamacpp-llama3.2-gguf": "llamacpp-llama3.2/source"}
# llama.cpp's converted vocabularies (tokenizer only): ptrain's tokenizer from tokenizer.ggml.* =
# transformers' GGUF tokenizer on ids.
# Three in CI; --all-gguf-vocabs adds the rest of the corpus's (a few minutes: transformers builds
# each tokenizer in Python).
GGUF_VOCAB_NAMES = ["llama-bpe", "llama-spm", "qwen2"] + (
    ["qwen35", "gpt-2", "falcon", "starcoder", "aquila"] if "--all-gguf-vocabs" in sys.argv else [])
GGUF_VOCABS = {f"ggml-vocab-{v}": f"ggml-vocabs/ggml-vocab-{v}.gguf" for v in GGUF_VOCAB_NAMES}
MIXED = """The quick brown fox jumps over the lazy dog. It's 3:45pm; we'd rather've won 1,234,567 times!
def train(step: int) -> float:
    return loss.item()  # 0x1F600 and 3.14159
Ünïcödé façade, naïve café — “quotes” and ‘apostrophes’… 東京は日本の首都です。안녕하세요. Привет, мир!
Emoji: 😀🚀👍🏽 and combining e\u0301 vs \u00e9; tabs\there\tand   three   spaces.

    indented line after a blank one
\r\nwindows line ending and trailing spaces   
"""


def texts_with_specials(tok):
    specials = [t for t in tok.all_special_tokens if t]
    return MIXED + " ".join(specials[:6]) + "\n" + MIXED.upper() + "\n".join(f"item {i}: {i * i}" for i in range(60))


def ptrain_tokenize(binary, tok_dir, text, tmp, *options, log=None):
    """(the ids, the token file) or (None, the error); `log`, a list, receives what it printed."""
    src, out = os.path.join(tmp, "text.txt"), os.path.join(tmp, "tokens.bin")
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    r = subprocess.run([binary, "tokenize", "--tokenizer", tok_dir, "--in", src, "--out", out, "--token-bytes", "4",
                        *options], capture_output=True, text=True)
    if log is not None:
        log.append(r.stderr + r.stdout)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1]
    return np.frombuffer(open(out, "rb").read()[32:], dtype=np.uint32).tolist(), out


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def chunked_check(binary, source, tok, text, tmp):
    """`ptrain tokenize --chunk-kib 1 --threads 2` of the mixed text repeated with every kind of line
    end between the copies (cut into chunks of about 1 KiB where the tokenizer may cut) = transformers'
    encode of the whole. Returns (ok, what)."""
    big = "".join(text + sep for sep in ["\n", "\n\n", " \n", "\n\t", "\r\n", ".\n"] * 40)
    want = tok.encode(big, add_special_tokens=False, verbose=False)
    log = []
    got, error = ptrain_tokenize(binary, source, big, tmp, "--chunk-kib", "1", "--threads", "2", log=log)
    if got is None:
        return False, f"chunked: REFUSED: {error}"
    parts = re.search(r"the text in \d+ parts?", log[0])
    parts = parts.group(0) if parts else "?"
    if got != want:
        return False, f"chunked ({parts}): ids DIFFER at {first_difference(got, want)} of {len(want)}"
    return True, f"chunked, 2 threads ({parts}): {len(want)} ids equal"


def ptrain_eval(binary, model_dir, tokens_path, tmp, fmt="tokens", seq=SEQ, report=None, model_keys=""):
    """(eval's JSON, None, the ignored-keys lines of `ptrain check`) or (None, the error, ...);
    `report`, a list, receives every line `ptrain check` printed."""
    cfg = os.path.join(tmp, "eval.toml")
    with open(cfg, "w") as f:
        f.write(f'[run]\nname = "realfiles"\noutput_dir = "{tmp}/run"\n[model]\nhf_path = "{model_dir}"\n{model_keys}'
                f'[data]\npath = "{tokens_path}"\nformat = "{fmt}"\nseq_len = {seq}\nmicro_batch_size = 2\n'
                + ('cache = false\n' if fmt == "jsonl" else "") + '[precision]\nmode = "fp32"\n[training]\ndevice = "cpu"\n')
    check = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True)
    ignored = [line for line in check.stdout.splitlines() if "ignored" in line]
    if report is not None:
        report.extend((check.stdout + check.stderr).splitlines())
    if check.returncode != 0:
        errors = [line for line in (check.stderr + check.stdout).splitlines() if line.startswith("error")]
        return None, "; ".join(errors) or (check.stderr or check.stdout).strip().splitlines()[-1], ignored
    r = subprocess.run([binary, "eval", "--config", cfg, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1], ignored
    return json.loads(r.stdout.strip().splitlines()[-1]), None, ignored


def hf_eval(model_dir, ids, gguf_file=None, source=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_file, dtype=torch.float32)
    if source:  # the network of `source`'s config.json with the weights transformers read from the file
        weights = model.state_dict()
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32)
        model.load_state_dict(weights)
    model.eval()
    n = len(ids) // (SEQ + 1)
    w = torch.tensor(ids[:n * (SEQ + 1)], dtype=torch.long).view(n, SEQ + 1)
    with torch.no_grad():
        logits = model(input_ids=w[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
    return float(loss), n


def chat_check(binary, d, tok, tmp, gguf_file=None):
    """(ptrain loss, transformers loss, trained tokens of each) over CHATS, or None without a
    ChatML template. `d`: a model directory, or with `gguf_file` the directory holding that file."""
    if "<|im_start|>" not in (tok.chat_template or ""):
        return None
    path = os.path.join(tmp, "chats.jsonl")
    with open(path, "w") as f:
        for chat in CHATS:
            f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")
    result, error, _ = ptrain_eval(binary, os.path.join(d, gguf_file) if gguf_file else d, path, tmp, fmt="jsonl",
                                   seq=256)
    if result is None:
        return error
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=gguf_file, dtype=torch.float32)
    loss, tokens = replies_loss(tok, model, [(chat, None) for chat in CHATS])
    return result["mean_loss"], loss, result["tokens"], tokens


def sft_text_records(eos):
    """Text records of both kinds (as tests/fixtures/make_trl_fixtures.py's text_records)."""
    return ([{"text": MIXED[:200]}, {"text": "Done." + eos}, {"text": f"One.{eos} Two."}],
            [{"prompt": "Q: What is 2+3?\nA:", "completion": " 5"}, {"prompt": "Answer: ", "completion": "yes"},
             {"prompt": "Line one\n", "completion": "\nLine two"}, {"prompt": "", "completion": "Only a completion."},
             {"prompt": "Say it:", "completion": " done" + eos}])


def read_sample_cache(path):
    """[(ids, trained flags)] of a ptrain sample cache (src/data/sample_cache.cpp's layout)."""
    with open(path, "rb") as f:
        data = f.read()
    fields = np.frombuffer(data[-112:], dtype=np.dtype([
        ("magic", "S8"), ("version", "<u4"), ("crc", "<u4"), ("key", "<u8"), ("samples", "<i8"), ("ids", "<i8"),
        ("trained_at", "<i8"), ("offsets_at", "<i8"), ("lines_at", "<i8"), ("counts_at", "<i8"), ("meta_at", "<i8"),
        ("meta_bytes", "<i8"), ("total_trained", "<i8"), ("max_id", "<i4"), ("reserved", "<u4"),
        ("content_hash", "<u8")]))[0]
    n, total = int(fields["samples"]), int(fields["ids"])
    ids = np.frombuffer(data, dtype="<i4", count=total)
    trained = np.frombuffer(data, dtype=np.uint8, count=total, offset=int(fields["trained_at"]))
    offsets = np.frombuffer(data, dtype="<i8", count=n + 1, offset=int(fields["offsets_at"]))
    return [(ids[a:b].tolist(), trained[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]


def sft_text_check(binary, source, tok, tmp):
    """(records compared, problem or None): the text records' samples in ptrain's cache (the tiny
    preset model, `source` as data.tokenizer) against TRL's SFTTrainer train dataset (a tiny random
    model of the tokenizer's vocabulary). A tokenizer naming no eos_token: ptrain must refuse."""
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer
    texts, pairs = sft_text_records(tok.eos_token or "")
    want = []
    for records in (texts, pairs) if tok.eos_token else ():  # TRL reads one kind a dataset
        model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tok)))
        args = SFTConfig(output_dir=os.path.join(tmp, "trl"), report_to=[], max_length=None, bf16=False, use_cpu=True)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(records), processing_class=tok)
        want += [(list(r["input_ids"]), [int(x != -100) for x in r["labels"]]) for r in trainer.train_dataset]
    path = os.path.join(tmp, "text.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in texts + pairs)
    cache = os.path.join(tmp, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    cfg = os.path.join(tmp, "text.toml")
    with open(cfg, "w") as f:
        f.write(f'[run]\nname = "realfiles"\noutput_dir = "{tmp}/run"\n[model]\npreset = "tiny"\nvocab_size = {len(tok)}\n'
                f'[data]\npath = "{path}"\n'
                f'format = "jsonl"\ntokenizer = "{source}"\nseq_len = 250\nmicro_batch_size = 1\nval_fraction = 0\n'
                f'cache_dir = "{cache}"\n[precision]\nmode = "fp32"\n[training]\ndevice = "cpu"\n')
    r = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True)
    if tok.eos_token is None:  # TRL's add_eos raises on None
        named = "this tokenizer names none" in r.stderr + r.stdout
        return 0, None if r.returncode == 2 and named else "ptrain did not refuse a tokenizer naming no eos_token"
    if r.returncode != 0:
        errors = [line for line in (r.stderr + r.stdout).splitlines() if line.startswith("error")]
        return 0, "ptrain check: " + ("; ".join(errors) or (r.stderr or r.stdout).strip().splitlines()[-1])
    files = [f for f in os.listdir(cache) if f.endswith(".samples")] if os.path.isdir(cache) else []
    if len(files) != 1:
        return 0, f"ptrain check left {len(files)} sample caches in {cache}"
    got = read_sample_cache(os.path.join(cache, files[0]))
    if len(got) != len(want):
        return 0, f"{len(got)} samples, TRL {len(want)}"
    for i, ((ids, trained), (ids_ref, trained_ref)) in enumerate(zip(got, want)):
        record = json.dumps((texts + pairs)[i], ensure_ascii=False)[:60]
        if ids != ids_ref:
            first = first_difference(ids, ids_ref)
            return i, f"{record}: ids differ at {first}: ptrain {ids[first:first + 4]} TRL {ids_ref[first:first + 4]}"
        if trained[1:] != trained_ref[1:]:  # the first id is no prediction's target
            return i, f"{record}: trained tokens differ at {first_difference(trained[1:], trained_ref[1:]) + 1}"
    return len(want), None


def replies_loss(tok, model, chats, reply=QWEN_REPLY):
    """transformers' mean loss over the replies of `chats` ((messages, tools) pairs) as
    apply_chat_template renders them — labels -100 but for each reply, from after the last of its
    headers before its end of turn through that end (`reply`: ChatML's <|im_end|> and newline by
    default) — and the number of trained tokens."""
    total, tokens = 0.0, 0
    for messages, tools in chats:
        out = tok.apply_chat_template(messages, tools=tools, tokenize=True)
        ids = list(out["input_ids"]) if hasattr(out, "keys") else list(out)
        labels = reply_labels(tok, ids, *reply)
        n = sum(1 for label in labels[1:] if label != -100)
        if n == 0:  # a chat without a reply: nothing to train (ptrain leaves it out), and a loss of nan
            continue
        with torch.no_grad():
            total += model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item() * n
        tokens += n
    return total / tokens, tokens


# Model sets whose `ptrain export --gguf` (f32) is read back: transformers' GGUF tokenizer (from
# tokenizer.ggml.*, its split from tokenizer.ggml.pre) = the directory's on the mixed text, and
# `ptrain tokenize` of the file = the same.
GGUF_EXPORTS = ["hf5-mistral-nemo"]


def export_check(binary, d, text, want, tmp):
    """(None, what) when the export reads back to the same ids, else (the problem, None)."""
    cfg, out = os.path.join(tmp, "export.toml"), os.path.join(tmp, "export.gguf")
    with open(cfg, "w") as f:
        f.write(f'[model]\nhf_path = "{d}"\n')
    r = subprocess.run([binary, "export", "--gguf", out, "--config", cfg], capture_output=True, text=True)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip().splitlines()[-1], None
    from gguf import GGUFReader
    field = GGUFReader(out).fields["tokenizer.ggml.pre"]
    pre = bytes(field.parts[field.data[0]]).decode()
    theirs = AutoTokenizer.from_pretrained(tmp, gguf_file="export.gguf").encode(text, add_special_tokens=False)
    ours, _ = ptrain_tokenize(binary, out, text, tmp)
    if theirs != want or ours != want:
        return f"export --gguf (pre {pre}): transformers' GGUF tokenizer {'=' if theirs == want else '!='} the " \
               f"directory's, ptrain's of the file {'=' if ours == want else '!='}", None
    return None, f"export --gguf: tokenizer.ggml.pre {pre}, transformers' GGUF tokenizer and ptrain's of the file = " \
                 f"the directory's ids"


def chat_row(chat):
    """Prints chat_check's result; 1 when it is a refusal or a difference."""
    if isinstance(chat, str):
        print(f"{'':22} chat: REFUSED: {chat}")
        return 1
    if not chat:
        return 0
    ours, theirs, n_ours, n_theirs = chat
    rel = abs(ours - theirs) / abs(theirs)
    ok = n_ours == n_theirs and rel <= 1e-4  # as sweep.chat_roundtrip: few tokens, 30 layers
    print(f"{'':22} chat: {n_ours} trained tokens (transformers {n_theirs}), loss {ours:.6f} / "
          f"{theirs:.6f}, rel. diff {rel:.1e}" + ("" if ok else "  DIFFER"))
    return 0 if ok else 1


# llama.cpp's copies of released chat templates (the corpus's chat-templates set), each tried with
# the corpus's model of its model's family (a real tokenizer; DeepSeek-R1's distills: the -r1 sets,
# its special tokens renamed as theirs), the others with the Qwen2 one's.
TEMPLATE_SETS = [("mistralai-Mistral-Nemo-", "hf5-mistral-nemo"), ("unsloth-mistral-Devstral-", "hf5-mistral-nemo"), ("meta-llama-", "hf5-llama"), ("deepseek-ai-DeepSeek-R1-Distill-Llama", "hf5-llama-r1"),
                 ("NousResearch-Hermes", "hf5-llama"), ("fireworks-ai-llama-3", "hf5-llama"),
                 ("meetkai-functionary", "hf5-llama"), ("Qwen-Qwen3-", "hf5-qwen3"),
                 ("deepseek-ai-DeepSeek-R1-Distill-Qwen", "hf5-qwen2-r1"), ("mistralai-", "hf5-mistral"),
                 ("unsloth-mistral-", "hf5-mistral"), ("Mistral-", "hf5-mistral")]
# Rows long enough for every chat whole (a cut reply would train fewer tokens than transformers scores):
# Devstral's default system message is ~1,500 Tekken tokens.
TEMPLATE_SEQ = {"hf5-mistral-nemo": 2048}
# Templates other than llama.cpp's copies: (the file in the corpus, the corpus model to try it with).
OTHER_TEMPLATES = {
    # what transformers 5.23 attaches when it converts a Tekken vocabulary (mistral-common generates it)
    "mistral-common-tekken-v3": ("mistral-tekken-hf5/chat_template.jinja", "hf5-mistral-nemo"),
}
# The released templates of the models ptrain trains (Llama, Qwen2 / Qwen3 based): each must be recognized and render as
# transformers renders it. Every other one must render so too, or be refused naming the file.
MUST_RENDER = ["meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
               "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen-QwQ-32B",
               "mistralai-Mistral-Nemo-Instruct-2407", "unsloth-mistral-Devstral-Small-2507", "mistral-common-tekken-v3",
               "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"]
# Where a reply starts and ends in each kind of template ptrain renders (data.chat_template names).
REPLY_SPANS = {"llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", ["<|eot_id|>"]),
               "chatml": ("<|im_start|>assistant\n", ["<|im_end|>", "\n"]), "mistral": ("[/INST]", ["</s>"]),
               "deepseek-r1": ("<｜Assistant｜>", ["<｜end▁of▁sentence｜>"])}
SPAN_OF_KIND = {"llama3": "llama3", "llama3.1": "llama3", "llama3.2": "llama3", "qwen2.5": "chatml",
                "chatml": "chatml", "qwen3": "chatml", "qwq": "chatml", "mistral": "mistral", "mistral-system-first": "mistral",
                "mistral-v0.2": "mistral", "mistral-v0.1": "mistral", "mistral-nemo": "mistral", "devstral": "mistral", "mistral-tekken": "mistral",
                "deepseek-r1": "deepseek-r1"}
# CHATS and one with reasoning in its replies (Qwen3's templates keep the last one's, drop the first's).
TEMPLATE_CHATS = CHATS + [[{"role": "user", "content": "What is 2 + 3?"},
                           {"role": "assistant", "content": "<think>\nTwo plus three.\n</think>\n\n5"},
                           {"role": "user", "content": "And 4 + 4?"},
                           {"role": "assistant", "content": "<think>Four and four.</think>8"}]]


def with_template(src, template, dst):
    """`src` (a corpus model directory) with `template` as its chat template: the files linked, the
    template as chat_template.jinja, tokenizer_config.json's own chat_template left out."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if f in ("chat_template.jinja", "additional_chat_templates", "DONE"):
            continue
        if f == "tokenizer_config.json":
            with open(os.path.join(src, f)) as fin:
                cfg = json.load(fin)
            cfg.pop("chat_template", None)
            with open(os.path.join(dst, f), "w") as fout:
                json.dump(cfg, fout, ensure_ascii=False, indent=2)
        else:
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    shutil.copyfile(template, os.path.join(dst, "chat_template.jinja"))


def template_ptrain(binary, corpus, name, tmp):
    """ptrain's side of template_check: (corpus set, model directory, eval's JSON, error, check's lines)."""
    if name in OTHER_TEMPLATES:
        template, base = OTHER_TEMPLATES[name]
    else:
        template = os.path.join("chat-templates", name + ".jinja")
        base = next((s for prefix, s in TEMPLATE_SETS if name.startswith(prefix)), "hf5-qwen2")
    tmp = os.path.join(tmp, name)  # its own: two run at once
    d = os.path.join(tmp, "model")
    with_template(os.path.join(corpus, base), os.path.join(corpus, template), d)
    path = os.path.join(tmp, "chats.jsonl")
    with open(path, "w") as f:
        for chat in TEMPLATE_CHATS:
            f.write(json.dumps({"messages": chat}, ensure_ascii=False) + "\n")
    report = []
    result, error, _ = ptrain_eval(binary, d, path, tmp, fmt="jsonl", seq=TEMPLATE_SEQ.get(base, 256), report=report)
    return base, d, result, error, report


def template_check(name, base, d, result, error, report):
    """(ok, what) for the released template `name`: rendered by ptrain as transformers renders it
    (the same trained tokens, the loss within 1e-4), or refused by ptrain naming the file."""
    if result is None:
        named = "chat_template.jinja" in error
        return named and name not in MUST_RENDER, f"{base}: refused{'' if named else ' WITHOUT NAMING THE FILE'}: " \
            + error.split("chat_template.jinja", 1)[-1].lstrip(":, ")[:110]
    kind = next((line.split("chats as ", 1)[1].split()[0] for line in report if "chats as " in line), None)
    if kind not in SPAN_OF_KIND:
        return False, f"{base}: rendered, but ptrain check names no template kind ({kind})"
    header, end = REPLY_SPANS[SPAN_OF_KIND[kind]]
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    total, tokens = 0.0, 0
    for chat in TEMPLATE_CHATS:
        try:
            out = tok.apply_chat_template(chat, tokenize=True)
        except Exception as e:  # noqa: BLE001  (the template's raise_exception, or a Jinja error)
            return False, f"{base}: ptrain renders it as {kind}; transformers refuses a chat: {e}"
        ids = list(out["input_ids"]) if hasattr(out, "keys") else list(out)
        labels = labels_of(tok, ids, header, end)
        n = sum(1 for label in labels[1:] if label != -100)
        with torch.no_grad():
            total += model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item() * n
        tokens += n
    rel = abs(result["mean_loss"] - total / tokens) / abs(total / tokens)
    ok = result["tokens"] == tokens and rel <= 1e-4
    return ok, (f"{base}: rendered as {kind}: {result['tokens']} trained tokens (transformers {tokens}), "
                f"loss rel. diff {rel:.1e}" + ("" if ok else "  DIFFER"))


def templates(binary, corpus):
    """Every released template of the corpus through template_check; the number that failed."""
    folder = os.path.join(corpus, "chat-templates")
    names = sorted(f[:-len(".jinja")] for f in os.listdir(folder) if f.endswith(".jinja"))
    copies = len(names)
    names += [n for n, (template, _) in OTHER_TEMPLATES.items() if os.path.exists(os.path.join(corpus, template))]
    failures, rendered = 0, 0
    print(f"\nreleased chat templates ({copies} of llama.cpp's copies, {len(names) - copies} more): "
          "ptrain = apply_chat_template, or refused")
    with tempfile.TemporaryDirectory() as tmp:
        with ThreadPoolExecutor(2) as pool:  # ptrain two at a time; transformers' loading is not thread-safe
            ours = list(pool.map(lambda name: template_ptrain(binary, corpus, name, tmp), names))
        for name, run in zip(names, ours):
            ok, what = template_check(name, *run)
            failures += not ok
            rendered += "rendered as" in what
            print(f"  {name:48} {'ok' if ok else 'FAIL':4} {what}")
    missing = [n for n in MUST_RENDER if n not in names]
    if missing:
        print(f"  missing from the corpus: {', '.join(missing)}")
    print(f"{len(names)} templates: {rendered} rendered as transformers renders them, "
          f"{len(names) - rendered} refused by name; {failures + len(missing)} failed")
    return failures + len(missing)


# Chats with tools under the released templates: Qwen2.5's, Qwen3's (first release), Llama 3.1's,
# 3.2's and 3.3's and Mistral Nemo's render them (the real tokenizers of hf5-qwen2 / hf5-qwen3, whose
# <tool_call> tokens are as released, Llama 3.2's of hf5-llama and Nemo's Tekken one of
# hf5-mistral-nemo), with the records each template raises on refused (and those ptrain refuses
# knowingly: LLAMA_REFUSED, NEMO_REFUSED); QwQ's refuses them all.
# name: (corpus model, the records, those ptrain refuses knowingly, a reply's headers and end).
LLAMA_TOOL_RECORDS = TOOL_RECORDS + LLAMA_RECORDS
TOOL_TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": ("hf5-qwen2", TOOL_RECORDS, {}, QWEN_REPLY),
    "Qwen-Qwen3-0.6B": ("hf5-qwen3", TOOL_RECORDS + QWEN3_RECORDS, {}, QWEN_REPLY),
    "meta-llama-Llama-3.1-8B-Instruct": ("hf5-llama", LLAMA_TOOL_RECORDS, LLAMA_REFUSED, LLAMA_REPLY),
    "meta-llama-Llama-3.2-3B-Instruct": ("hf5-llama", LLAMA_TOOL_RECORDS, LLAMA_REFUSED, LLAMA_REPLY),
    "meta-llama-Llama-3.3-70B-Instruct": ("hf5-llama", LLAMA_TOOL_RECORDS, LLAMA_REFUSED, LLAMA_REPLY),
    "mistralai-Mistral-Nemo-Instruct-2407": ("hf5-mistral-nemo", TOOL_RECORDS + NEMO_RECORDS, NEMO_REFUSED,
                                             NEMO_REPLY),
    "Qwen-QwQ-32B": ("hf5-qwen2", None, None, None)}


def tool_chats(binary, corpus):
    """`ptrain eval` of chats with tools (JSONL) with each of TOOL_TEMPLATES = transformers' loss over
    the replies as apply_chat_template(messages, tools=...) renders them (the same trained tokens,
    the loss within 1e-4), and each record the template raises on refused alone; QwQ's refuses them
    all. The number that failed."""
    failures = 0
    print("\nchats with tools (tools, tool calls, tool results): ptrain = apply_chat_template, or refused")
    for name, (base, records, refused, reply) in TOOL_TEMPLATES.items():
        template = os.path.join(corpus, "chat-templates", name + ".jinja")
        if not os.path.exists(template):
            print(f"  {name:40} FAIL missing from the corpus")
            failures += 1
            continue
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, "model")
            with_template(os.path.join(corpus, base), template, d)
            # the chats are longer than the corpus models' 256 positions (RoPE reaches past them)
            with open(os.path.join(d, "config.json")) as f:
                config = json.load(f)
            config["max_position_embeddings"] = 1024
            os.remove(os.path.join(d, "config.json"))
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(config, f, indent=2)

            def ptrain_on(lines, tag):
                path = os.path.join(tmp, tag + ".jsonl")
                with open(path, "w") as f:
                    f.write("\n".join(lines) + "\n")
                return ptrain_eval(binary, d, path, tmp, fmt="jsonl", seq=1024)[:2]

            if records is None:
                result, error = ptrain_on(TOOL_RECORDS, "all")
                ok = result is None and "ptrain renders tools, tool calls and tool results only with" in error
                failures += not ok
                print(f"  {name:40} {'ok' if ok else 'FAIL':4} {base}: "
                      + (f"refused: {error[:150]}" if result is None else "RENDERED"))
                continue
            tok = AutoTokenizer.from_pretrained(d)
            rendered, raised = [], []
            for line in records:
                record = json.loads(line)
                try:
                    tok.apply_chat_template(record["messages"], tools=record.get("tools"), tokenize=False)
                    (raised if line in refused else rendered).append(line)
                except Exception:  # noqa: BLE001  (the template raises on it: ptrain must refuse it)
                    raised.append(line)
            not_refused = sum(ptrain_on([line], f"raised{i}")[0] is not None for i, line in enumerate(raised))
            result, error = ptrain_on(rendered, "rendered")
            if result is None:
                print(f"  {name:40} FAIL {base}: refused: {error}")
                failures += 1
                continue
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
            parsed = [json.loads(line) for line in rendered]
            loss, tokens = replies_loss(tok, model, [(r["messages"], r.get("tools")) for r in parsed], reply)
            rel = abs(result["mean_loss"] - loss) / abs(loss)
            ok = result["tokens"] == tokens and rel <= 1e-4 and not not_refused
            failures += not ok
            print(f"  {name:40} {'ok' if ok else 'FAIL':4} {base}: {len(rendered)} chats, {result['tokens']} trained "
                  f"tokens (transformers {tokens}), loss {result['mean_loss']:.6f} / {loss:.6f}, rel. diff "
                  f"{rel:.1e}" + ("" if ok else "  DIFFER") + f"; {len(raised)} the template raises on "
                  f"(or ptrain refuses knowingly), {len(raised) - not_refused} refused")
    return failures


def main():
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # TRL's warning on a prompt that is no prefix: sft_text_check's case
    import datasets
    datasets.disable_progress_bars()
    binary = os.path.abspath(sys.argv[1])
    corpus = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptrain", "realfiles")
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
    sets = sorted(d for d in os.listdir(corpus) if os.path.exists(os.path.join(corpus, d, "DONE"))
                  and os.path.exists(os.path.join(corpus, d, "tokenizer.json")) and (not only or d in only))
    gguf = {name: path for name, path in {**GGUF_VOCABS, **GGUF_FILES}.items()
            if (not only or name in only) and os.path.exists(os.path.join(corpus, path))}
    if not sets and not gguf and not os.path.exists(os.path.join(corpus, "chat-templates", "DONE")):
        raise SystemExit(f"no corpus sets in {corpus}: run tests/realfiles/make_corpus.py first")
    failures = 0
    print(f"{'set':22} {'tokens':>7} {'ids':>6} {'eval: ptrain':>14} {'transformers':>13} {'rel. diff':>10}  ignored keys")
    # (name, the model directory or the GGUF file's, the GGUF file or None, whether it holds a model)
    entries = [(name, os.path.join(corpus, name), None, os.path.exists(os.path.join(corpus, name, "config.json")))
               for name in sets]
    for name, path in gguf.items():  # GGUF files: their tokenizer, and a model as model.hf_path
        full = os.path.join(corpus, path)
        entries.append((name, os.path.dirname(full), os.path.basename(full), name in GGUF_FILES))
        sets.append(name)
    for name, d, gguf_file, has_model in entries:
        source = os.path.join(d, gguf_file) if gguf_file else d  # what ptrain is given
        tok = AutoTokenizer.from_pretrained(d, gguf_file=gguf_file)
        text = texts_with_specials(tok)
        want = tok.encode(text, add_special_tokens=False)
        with tempfile.TemporaryDirectory() as tmp:
            got, tokens_path = ptrain_tokenize(binary, source, text, tmp)
            if got is None:
                print(f"{name:22} REFUSED by ptrain tokenize: {tokens_path}")
                failures += 1
                continue
            same = got == want
            if not same:
                first = first_difference(got, want)
                print(f"{name:22} ids differ at {first}: ptrain {got[first:first + 6]} transformers {want[first:first + 6]}")
                failures += 1
            chunked_ok, chunked = chunked_check(binary, source, tok, text, tmp)
            failures += not chunked_ok
            print(f"{name:22} {chunked}")
            compared, problem = sft_text_check(binary, source, tok, tmp)
            print(f"{name:22} sft text records: " + (
                f"DIFFER after {compared}: {problem}" if problem else f"{compared} = TRL's SFTTrainer" if compared
                else "no eos_token: refused by ptrain and by TRL"))
            failures += problem is not None
            row = f"{name:22} {len(want):7} {'equal' if same else 'DIFFER':>6}"
            if not has_model:
                print(row + f" {'-':>14} {'-':>13} {'-':>10}  (tokenizer only)")
                continue
            # a longer stream for the eval: the text repeated, so there are several windows
            long_ids, long_path = ptrain_tokenize(binary, source, (text + "\n") * 3, tmp)
            read_as = LLAMA_CPP_READ.get(name)
            result, error, ignored = ptrain_eval(binary, source, long_path, tmp,
                                                 model_keys='gguf_reader = "llama.cpp"\n' if read_as else "")
            if result is None:
                print(row + f"  REFUSED: {error}")
                failures += 1
                continue
            ref, windows = hf_eval(d, long_ids, gguf_file=gguf_file,
                                   source=os.path.join(corpus, read_as) if read_as else None)
            rel = abs(result["mean_loss"] - ref) / abs(ref)
            ok = rel <= 1e-5 and result["windows"] == windows
            failures += not ok
            keys = "; ".join(line.split("ignored")[-1].split(":", 1)[-1].strip() for line in ignored) or "none"
            print(row + f" {result['mean_loss']:14.6f} {ref:13.6f} {rel:10.1e}  {keys}" + ("" if ok else "  DIFFER"))
            if name in GGUF_EXPORTS:
                problem, what = export_check(binary, d, text, want, tmp)
                print(f"{'':22} {what or 'FAILED: ' + problem}")
                failures += problem is not None
            failures += chat_row(chat_check(binary, d, tok, tmp, gguf_file=gguf_file))
    print(f"{len(sets)} sets, {failures} with a refusal or a difference")
    if os.path.exists(os.path.join(corpus, "chat-templates", "DONE")) and (not only or "chat-templates" in only):
        failures += templates(binary, corpus)
    if os.path.exists(os.path.join(corpus, "chat-templates", "DONE")) and (not only or "tool-chats" in only):
        failures += tool_chats(binary, corpus)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
