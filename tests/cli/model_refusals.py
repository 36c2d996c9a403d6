#!/usr/bin/env python3
"""Models ptrain does not fully understand are refused by name, never trained.

Each case copies a committed family fixture (tests/fixtures/make_step_fixtures.py), damages it
one way — a config.json key that changes the network, a tensor too many or too few, a wrong
shape or dtype, a missing or truncated shard, no weights at all — and checks that both
`ptrain check` and `ptrain train` exit 2 naming the key, tensor or file, and that the training
run wrote nothing (no metrics.jsonl, no checkpoint).

Usage: model_refusals.py PTRAIN_BINARY FIXTURES_DIR WORK_DIR
Prints one line per check and `N passed, N failed`; exit 1 when any failed.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from variant_edit import edited  # noqa: E402  (the fixture scripts' helper)

passed, failed = 0, 0


def check(ok, what, detail=""):
    global passed, failed
    passed, failed = passed + ok, failed + (not ok)
    print(("PASS " if ok else "FAIL ") + what + ("" if ok else "\n" + detail), flush=True)


def write_tokens(path, n, vocab):
    """ptrain's token file: 32-byte header (magic, version 1, width 2, count, vocab), uint16 ids."""
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(3)).to(torch.int16)
    with open(path, "wb") as f:
        f.write(b"PTRAINTK" + struct.pack("<IIQI", 1, 2, n, vocab) + bytes(4))
        f.write(ids.numpy().tobytes())


def edit_config(d, **changes):
    with open(f"{d}/config.json") as f:
        c = edited(json.load(f), changes)
    with open(f"{d}/config.json", "w") as f:
        json.dump(c, f, indent=2)


def edit_tensors(d, fn):
    t = load_file(f"{d}/model.safetensors")
    fn(t)
    save_file(t, f"{d}/model.safetensors", metadata={"format": "pt"})


def shard(d):
    """Re-saves d's weights as two shards with an index, as transformers does."""
    t = load_file(f"{d}/model.safetensors")
    os.remove(f"{d}/model.safetensors")
    names = sorted(t)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate([names[:half], names[half:]]):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: t[n] for n in part}, f"{d}/{file}", metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(f"{d}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def rewrite_zip(path, edit):
    """Rewrites torch.save's zip at `path` with each record's bytes passed through edit(name, data)."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        records = [(i.filename, edit(i.filename, z.read(i))) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(name, data)


def shift_norm_view(path):
    """Moves the view model.norm.weight = storage[2:] of a pytorch_model.bin one element on, so
    that it reads one element past its storage (the pickle's offset 2, then its size tuple)."""
    def shifted(name, data):
        if not name.endswith("/data.pkl"):
            return data
        hits = [i for i in range(len(data) - 4) if data[i:i + 3] == b"K\x02K" and data[i + 4] == 0x85]
        assert len(hits) == 1, hits
        return data[:hits[0] + 1] + b"\x03" + data[hits[0] + 2:]
    rewrite_zip(path, shifted)


class RunsCode:
    """Pickled as a call of os.system, as a malicious pytorch_model.bin would hold one."""

    def __reduce__(self):
        return (os.system, ("true",))


def eval_config(work, model_dir):
    """Where eval_loss writes the config of `model_dir`: in `work`, never beside a fixture."""
    return os.path.join(work, os.path.basename(model_dir) + ".eval.toml")


def eval_loss(binary, work, model_dir):
    cfg = eval_config(work, model_dir)
    with open(cfg, "w") as f:
        f.write(f'[model]\nhf_path = "{model_dir}"\n[data]\npath = "{work}/train.bin"\nformat = "tokens"\n'
                'seq_len = 16\n[training]\ndevice = "cpu"\n[precision]\nmode = "fp32"\n')
    p = subprocess.run([binary, "eval", "--config", cfg, "--json"], capture_output=True, text=True, timeout=120)
    return json.loads(p.stdout.strip().splitlines()[-1])["mean_loss"] if p.returncode == 0 else p.stdout + p.stderr


def weight_file_choice(binary, fixtures, work):
    """The weight file read is the one transformers' from_pretrained loads: config.json's
    transformers_weights where it names one, else model.safetensors before an index — each beside
    a decoy of zeroed weights, transformers' choice confirmed by loading the directory with it."""
    from transformers import AutoModelForCausalLM
    want = eval_loss(binary, work, f"{fixtures}/hf_odd")

    def zeroed(path):
        save_file({k: torch.zeros_like(v) for k, v in load_file(path).items()}, path, metadata={"format": "pt"})

    named = f"{work}/weights_named"
    shutil.copytree(f"{fixtures}/hf_odd", named)
    os.rename(f"{named}/model.safetensors", f"{named}/renamed.safetensors")
    shutil.copy(f"{named}/renamed.safetensors", f"{named}/model.safetensors")
    zeroed(f"{named}/model.safetensors")
    edit_config(named, transformers_weights="renamed.safetensors")
    both = f"{work}/single_and_index"
    shutil.copytree(f"{fixtures}/hf_odd", both)
    shard(both)  # the shards (zeroed) and their index, then the whole model beside them
    for f in os.listdir(both):
        if f.startswith("model-0"):
            zeroed(f"{both}/{f}")
    shutil.copy(f"{fixtures}/hf_odd/model.safetensors", both)
    # pytorch_model.bin alone, as torch.save(model.state_dict()) writes it (an OrderedDict), in
    # bfloat16; and model.safetensors beside a zeroed one
    only_bin = f"{work}/only_bin"
    shutil.copytree(f"{fixtures}/hf_odd", only_bin)
    os.remove(f"{only_bin}/model.safetensors")
    torch.save(AutoModelForCausalLM.from_pretrained(f"{fixtures}/hf_odd", dtype=torch.float32).state_dict(),
               f"{only_bin}/pytorch_model.bin")
    beside_bin = f"{work}/safetensors_beside_bin"
    shutil.copytree(f"{fixtures}/hf_odd", beside_bin)
    torch.save({k: torch.zeros_like(v) for k, v in load_file(f"{beside_bin}/model.safetensors").items()},
               f"{beside_bin}/pytorch_model.bin")
    # every tensor a view into one flat storage: each read from its own part of the record
    flat_bin = f"{work}/bin_of_views"
    shutil.copytree(f"{fixtures}/hf_odd", flat_bin)
    state = load_file(f"{flat_bin}/model.safetensors")
    os.remove(f"{flat_bin}/model.safetensors")
    flat = torch.cat([v.flatten() for v in state.values()])
    views, at = {}, 0
    for k, v in state.items():
        views[k] = flat[at:at + v.numel()].view(v.shape)
        at += v.numel()
    torch.save(views, f"{flat_bin}/pytorch_model.bin")
    for d, what in ((named, "transformers_weights names it"), (both, "model.safetensors beside an index"),
                    (only_bin, "pytorch_model.bin, a state dict"), (beside_bin, "model.safetensors beside a .bin"),
                    (flat_bin, "pytorch_model.bin of views into one storage")):
        model = AutoModelForCausalLM.from_pretrained(d)
        transformers_reads_it = bool(model.model.embed_tokens.weight.abs().sum() > 0)
        got = eval_loss(binary, work, d)
        check(transformers_reads_it and got == want, f"the weight file transformers loads is read ({what}): "
              f"ptrain eval {got} = the fixture's {want}", f"transformers reads the real weights: {transformers_reads_it}")


def config_file_choice(binary, fixtures, work):
    """The config read is the one transformers' from_pretrained reads: where config.json lists
    configuration_files, the config.VERSION.json of the last version not above transformers' own,
    the names taken sorted as strings (so config.10.0.0.json, sorting first and above 5.23, stops
    the search at config.json). Each directory holds the right config once and a wrong one
    (rms_norm_eps 0.5) in the other files; transformers' choice is confirmed by loading it."""
    from transformers import AutoConfig
    want = eval_loss(binary, work, f"{fixtures}/hf_odd")
    with open(f"{fixtures}/hf_odd/config.json") as f:
        right = json.load(f)
    wrong = {**right, "rms_norm_eps": 0.5}
    layouts = {  # listed files, the file holding the right config
        "versioned": (["config.4.0.0.json"], "config.4.0.0.json"),
        "reference_release": (["config.4.0.0.json", "config.5.23.json"], "config.5.23.json"),
        "newer_only": (["config.99.0.0.json"], "config.json"),
        "sorted_as_strings": (["config.4.0.0.json", "config.10.0.0.json"], "config.json"),
    }
    for name, (listed, holder) in layouts.items():
        d = f"{work}/config_files_{name}"
        shutil.copytree(f"{fixtures}/hf_odd", d)
        for file in ["config.json"] + listed:
            with open(f"{d}/{file}", "w") as f:
                json.dump({**(right if file == holder else wrong), "configuration_files": listed}, f, indent=2)
        transformers_reads_it = AutoConfig.from_pretrained(d).rms_norm_eps == right["rms_norm_eps"]
        got = eval_loss(binary, work, d)
        check(transformers_reads_it and got == want, f"the config file transformers reads is read ({name}: "
              f"{holder}): ptrain eval {got} = the fixture's {want}", f"transformers reads it: {transformers_reads_it}")


def base_model_names(binary, fixtures, work):
    """Names read as transformers loads them into the causal LM: a base model's save (its body's
    names without "model.", and architectures naming the base model, as AutoModel saves it), the
    same names under the causal-LM class (the layout Qwen3-Embedding is released in), and names
    with a "model." too many — each the fixture's network, transformers' reading confirmed by
    loading the directory with nothing missing."""
    from transformers import AutoModel, AutoModelForCausalLM

    def renamed(src, d, rename):
        shutil.copytree(f"{fixtures}/{src}", d)
        t = load_file(f"{d}/model.safetensors")
        save_file({rename(k): v for k, v in t.items()}, f"{d}/model.safetensors", metadata={"format": "pt"})

    base_save = f"{work}/base_model_save"
    AutoModel.from_pretrained(f"{fixtures}/hf_qwen2").save_pretrained(base_save)
    flat = f"{work}/flat_names"
    renamed("hf_qwen2", flat, lambda k: k.removeprefix("model."))
    doubled = f"{work}/doubled_prefix"
    renamed("hf_odd", doubled, lambda k: "model." + k)
    head_only = f"{work}/tied_head_only"  # transformers ties the pair the other way round
    renamed("hf_qwen2", head_only, lambda k: "lm_head.weight" if k == "model.embed_tokens.weight" else k)
    for d, src, what in ((base_save, "hf_qwen2", "transformers' save of Qwen2Model"),
                         (flat, "hf_qwen2", "flat names under Qwen2ForCausalLM"),
                         (doubled, "hf_odd", "every name with a \"model.\" too many"),
                         (head_only, "hf_qwen2", "tied, the head stored and not the embedding")):
        with open(f"{d}/config.json") as f:
            arch = json.load(f)["architectures"]
        _, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
        complete = not info["missing_keys"] and not info["unexpected_keys"]
        want, got = eval_loss(binary, work, f"{fixtures}/{src}"), eval_loss(binary, work, d)
        check(complete and got == want, f"read as transformers loads it ({what}, architectures {arch}): "
              f"ptrain eval {got} = the fixture's {want}", f"transformers' loading info: {info}")


def tied_head_stored_unequal(binary, fixtures, work):
    """A tied model (tie_word_embeddings true) whose checkpoint holds lm_head.weight with other
    values than the embedding, in one dtype: transformers 5.23 warns and loads it untied (its
    logits equal those of the same tensors under tie_word_embeddings false, checked here with the
    library itself), and ptrain reads it so: its eval equals that directory's, not the tied
    fixture's, and `ptrain check` says the head was read untied."""
    from transformers import AutoModelForCausalLM

    tied, untied = f"{work}/tied_head_unequal", f"{work}/tied_head_unequal_config_false"
    head = torch.randn(311, 84, generator=torch.Generator().manual_seed(7)) * 0.1
    for d in (tied, untied):
        shutil.copytree(f"{fixtures}/hf_qwen2", d)
        edit_tensors(d, lambda t: t.update({"lm_head.weight": head.clone()}))
    edit_config(untied, tie_word_embeddings=False)
    ids = torch.randint(0, 311, (2, 16), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(tied).eval()
        b = AutoModelForCausalLM.from_pretrained(untied).eval()
        same_logits = torch.equal(a(ids).logits, b(ids).logits)
        untied_by_hf = a.lm_head.weight.data_ptr() != a.model.embed_tokens.weight.data_ptr()
    fixture, want, got = (eval_loss(binary, work, d) for d in (f"{fixtures}/hf_qwen2", untied, tied))
    check(same_logits and untied_by_hf and got == want and want != fixture,
          f"a tied model's head stored unequal is read untied, as transformers loads it: ptrain eval {got} = "
          f"{want} (tie_word_embeddings false), not the tied fixture's {fixture}",
          f"transformers: logits equal {same_logits}, untied {untied_by_hf}")
    p = subprocess.run([binary, "check", "--config", eval_config(work, tied)], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and "read untied, as transformers loads it" in p.stdout,
          "`ptrain check` says the head was read untied", p.stdout[-2000:] + p.stderr[-2000:])


def main():
    binary, fixtures, work = (os.path.abspath(a) for a in sys.argv[1:4])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    write_tokens(f"{work}/train.bin", 4000, 257)  # 257: the smallest fixture vocabulary

    def case(name, fixture, damage, *patterns, seq_len=16, check_too=True, extra=""):
        d = f"{work}/{name}"
        shutil.copytree(f"{fixtures}/{fixture}", d)
        damage(d)
        cfg = f"{d}.toml"
        with open(cfg, "w") as f:
            f.write(f'[run]\noutput_dir = "{d}.run"\n[model]\nhf_path = "{d}"\n'
                    f'[data]\npath = "{work}/train.bin"\nformat = "tokens"\nseq_len = {seq_len}\nmicro_batch_size = 2\n'
                    f'[training]\nsteps = 2\ndevice = "cpu"\n' + extra)
        for command in (["check"] if check_too else []) + ["train"]:
            try:  # a refusal takes a second; a config.json that makes ptrain loop is a failure, not a hang
                p = subprocess.run([binary, command, "--config", cfg], capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                check(False, f"{name}: `ptrain {command}` exits 2", "still running after 60 s")
                continue
            out = p.stdout + p.stderr
            missing = [x for x in patterns if x not in out]
            check(p.returncode == 2 and not missing, f"{name}: `ptrain {command}` exits 2 naming {', '.join(patterns)}",
                  f"exit {p.returncode}; missing {missing} in:\n{out[-2000:]}")
        trained = os.path.exists(f"{d}.run/metrics.jsonl") or os.path.exists(f"{d}.run/checkpoints")
        check(not trained, f"{name}: nothing was trained")

    # config.json keys
    case("gemma", "hf_odd", lambda d: edit_config(d, model_type="gemma"), 'model_type "gemma"', "qwen3")
    case("no_model_type", "hf_odd", lambda d: edit_config(d, model_type=KeyError), 'no "model_type"')
    case("classifier", "hf_odd", lambda d: edit_config(d, architectures=["LlamaForSequenceClassification"]),
         "LlamaForSequenceClassification")
    # (a key transformers' code does not read for the family, such as num_local_experts in a Mistral
    # config, is ignored as transformers ignores it: HfKeys.*; a mixture of experts is another model_type)
    case("moe", "hf_mistral", lambda d: edit_config(d, model_type="mixtral"), 'model_type "mixtral"')
    case("chunked_attention", "hf_qwen3", lambda d: edit_config(d, attention_chunk_size=8), '"attention_chunk_size"')
    case("bidirectional", "hf_odd", lambda d: edit_config(d, is_causal=False), '"is_causal"')
    case("partial_rotary", "hf_odd", lambda d: edit_config(d, partial_rotary_factor=0.5), '"partial_rotary_factor"')
    case("dynamic_rope", "hf_qwen2", lambda d: edit_config(d, rope_parameters={"rope_type": "dynamic", "factor": 4.0,
                                                                                 "rope_theta": 1e6}), '"dynamic"')
    # YaRN is read; a key of it ptrain does not implement, or a value it cannot mean, is not
    case("yarn_extra", "hf_qwen2", lambda d: edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                               "rope_theta": 1e6, "low_freq_factor": 1.0}),
         "low_freq_factor", '"yarn"')
    case("yarn_truncate", "hf_qwen2", lambda d: edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                                  "rope_theta": 1e6, "truncate": None}),
         "truncate must be true or false")
    case("rope_extra", "hf_qwen3", lambda d: edit_config(d, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                               "mrope_section": [2, 2]}), "mrope_section")
    # read by from_pretrained: module fusions it applies (an inference optimisation that changes outputs)
    case("fusion", "hf_qwen2", lambda d: edit_config(d, fusion_config={"rms_norm": True}), '"fusion_config"')
    case("gelu", "hf_odd", lambda d: edit_config(d, hidden_act="gelu"), '"gelu"')
    case("attention_dropout", "hf_qwen2", lambda d: edit_config(d, attention_dropout=0.1), "attention_dropout")
    # both RoPE spellings: transformers would read rope_scaling and drop rope_parameters
    case("two_rope_spellings", "hf_odd", lambda d: edit_config(d, rope_scaling={"rope_type": "linear", "factor": 2.0}),
         '"rope_parameters" and "rope_scaling"')
    case("null_value", "hf_qwen3", lambda d: edit_config(d, rms_norm_eps=None), '"rms_norm_eps" is null')
    case("huge_layer_count", "hf_odd", lambda d: edit_config(d, num_hidden_layers=1 << 40), "model.n_layers",
         "must be <= 4096")
    # quantization: bitsandbytes NF4 is read (as QLoRA's base); every other kind is refused by name
    qlora = '[lora]\nenabled = true\ntargets = ["q", "v"]\n[quant]\nbase = "nf4"\n'
    case("quantized", "hf_odd", lambda d: edit_config(d, quantization_config={"quant_method": "bitsandbytes"}),
         "quantization_config.load_in_4bit", extra=qlora)
    case("gptq", "hf_odd", lambda d: edit_config(d, quantization_config={"quant_method": "gptq", "bits": 4}),
         "quantization_config.quant_method", "GPTQ", extra=qlora)

    def bnb_config(**changes):
        def damage(d):
            with open(f"{d}/config.json") as f:
                q = json.load(f)["quantization_config"]
            q.update(changes)
            edit_config(d, quantization_config=q)
        return damage
    case("bnb_fp4", "hf_odd_bnb4", bnb_config(bnb_4bit_quant_type="fp4"), "quantization_config.bnb_4bit_quant_type",
         "FP4", extra=qlora)
    case("bnb_8bit", "hf_odd_bnb4", bnb_config(load_in_8bit=True, _load_in_8bit=True, load_in_4bit=False,
                                               _load_in_4bit=False), "quantization_config.load_in_8bit", extra=qlora)
    case("bnb_unknown_option", "hf_odd_bnb4", bnb_config(bnb_4bit_new_option=1),
         "quantization_config.bnb_4bit_new_option", extra=qlora)
    case("bnb_without_nf4_base", "hf_odd_bnb4", lambda d: None, "quant.base", "bitsandbytes NF4",
         extra='[lora]\nenabled = true\n')
    case("bnb_double_quant_differs", "hf_odd_bnb4", lambda d: None, "quant.double_quant", "double-quantized",
         extra=qlora + "double_quant = false\n")

    def rename_state(t):
        for k in [k for k in t if k.endswith("quant_state.bitsandbytes__nf4")]:
            t[k.replace("__nf4", "__fp4")] = t.pop(k)
    case("bnb_fp4_tensors", "hf_odd_bnb4", lambda d: edit_tensors(d, rename_state),
         "quant_state.bitsandbytes__fp4' is quantization data", extra=qlora)

    def skip_module(t):  # q_proj kept in float32, as llm_int8_skip_modules would leave it
        for k in [k for k in t if k.startswith("model.layers.0.self_attn.q_proj.weight.")]:
            t.pop(k)
        t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(96, 96)
    case("bnb_unquantized_projection", "hf_odd_bnb4", lambda d: edit_tensors(d, skip_module),
         "'model.layers.0.self_attn.q_proj.weight' is F32", extra=qlora)

    def custom_map(t):
        t["model.layers.1.mlp.up_proj.weight.quant_map"] = torch.linspace(-1, 1, 16)
    case("bnb_custom_quant_map", "hf_odd_bnb4", lambda d: edit_tensors(d, custom_map),
         "'model.layers.1.mlp.up_proj.weight.quant_map' is not bitsandbytes' table", check_too=False, extra=qlora)

    def edit_state(change):
        def damage(t):
            name = "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"
            state = json.loads(bytes(t[name].tolist()))
            change(state)
            t[name] = torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)
        return damage
    state_shape = edit_state(lambda s: s.update(shape=list(reversed(s["shape"]))))
    case("bnb_quant_state_shape", "hf_odd_bnb4", lambda d: edit_tensors(d, state_shape),
         "model.layers.0.mlp.down_proj.weight", "quant_state.shape", check_too=False, extra=qlora)
    case("bnb_quant_state_unknown_key", "hf_odd_bnb4", lambda d: edit_tensors(d, edit_state(lambda s: s.update(zero_point=1))),
         "model.layers.0.mlp.down_proj.weight", 'quant_state key "zero_point"', check_too=False, extra=qlora)
    case("bnb_quant_state_dtype", "hf_odd_bnb4", lambda d: edit_tensors(d, edit_state(lambda s: s.update(dtype="int3"))),
         "model.layers.0.mlp.down_proj.weight", "quant_state.dtype is \"int3\"", check_too=False, extra=qlora)
    case("remote_code", "hf_qwen2", lambda d: edit_config(d, auto_map={"AutoModelForCausalLM": "x.Y"}), '"auto_map"')
    case("qwen3_attention_bias", "hf_qwen3", lambda d: edit_config(d, attention_bias=True), "q_proj.bias")
    case("pad_outside_vocab", "hf_odd", lambda d: edit_config(d, pad_token_id=300), "pad_token_id 300")
    case("qwen_sliding", "hf_qwen2", lambda d: edit_config(d, use_sliding_window=True, sliding_window=8),
         "use_sliding_window")
    case("qwen3_layer_types", "hf_qwen3", lambda d: edit_config(d, layer_types=["full_attention", "sliding_attention"]),
         "layer_types", "sliding_attention")
    # tensors
    case("unconsumed_bias", "hf_odd",
         lambda d: edit_tensors(d, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(96)})),
         "'model.layers.0.self_attn.q_proj.bias' is not part of")
    case("missing_bias", "hf_qwen2", lambda d: edit_tensors(d, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias")),
         "'model.layers.1.self_attn.k_proj.bias' is missing")
    case("missing_q_norm", "hf_qwen3", lambda d: edit_tensors(d, lambda t: t.pop("model.layers.0.self_attn.q_norm.weight")),
         "'model.layers.0.self_attn.q_norm.weight' is missing")
    case("wrong_shape", "hf_qwen3",
         lambda d: edit_tensors(d, lambda t: t.update({"model.layers.0.self_attn.k_norm.weight": torch.ones(16)})),
         "'model.layers.0.self_attn.k_norm.weight' has shape [16]")
    case("int8_tensor", "hf_llama_bias",
         lambda d: edit_tensors(d, lambda t: t.update({"model.norm.weight": torch.ones(72, dtype=torch.int8)})),
         "'model.norm.weight' is stored as I8")
    # a tied model whose lm_head differs from the embedding, stored in another dtype: whether
    # transformers ties them depends on the dtype it loads in (in one dtype: tied_head_stored_unequal)
    case("tied_lm_head_differs_in_another_dtype", "hf_qwen2",
         lambda d: edit_tensors(d, lambda t: t.update({"lm_head.weight": torch.randn(311, 84).bfloat16()})),
         "'lm_head.weight' (BF16) differs from model.embed_tokens.weight (F32)", check_too=False)
    # files
    def missing_shard(d):
        shard(d)
        os.remove(f"{d}/model-00002-of-00002.safetensors")
    case("missing_shard", "hf_qwen2", missing_shard, "model-00002-of-00002.safetensors", "missing")

    def truncated_shard(d):
        shard(d)
        path = f"{d}/model-00001-of-00002.safetensors"
        os.truncate(path, os.path.getsize(path) - 100)
    case("truncated_shard", "hf_qwen3", truncated_shard, "model-00001-of-00002.safetensors", "out of bounds")

    def unlisted(d):
        shard(d)
        with open(f"{d}/model.safetensors.index.json") as f:
            index = json.load(f)
        index["weight_map"].pop(sorted(index["weight_map"])[0])
        with open(f"{d}/model.safetensors.index.json", "w") as f:
            json.dump(index, f)
    case("index_omits_a_tensor", "hf_mistral", unlisted, "which the index does not list")
    case("no_weights", "hf_odd", lambda d: os.remove(f"{d}/model.safetensors"), "neither model.safetensors")
    # config.json's transformers_weights names the weight file from_pretrained loads
    case("weights_named_bin", "hf_odd", lambda d: edit_config(d, transformers_weights="pytorch_model.bin"),
         "transformers_weights", "reads safetensors files and their indexes only")
    case("weights_named_outside", "hf_odd", lambda d: edit_config(d, transformers_weights="../x.safetensors"),
         "not a file inside the model directory")
    case("weights_named_missing", "hf_odd", lambda d: edit_config(d, transformers_weights="other.safetensors"),
         "the weight file named there is missing")
    case("weights_named_number", "hf_odd", lambda d: edit_config(d, transformers_weights=3),
         "transformers reads a file name there")
    # config.json's configuration_files points transformers at another config file
    case("config_files_number", "hf_odd", lambda d: edit_config(d, configuration_files=3),
         "configuration_files = 3", "reads a list of file names there")
    case("config_files_prerelease", "hf_odd", lambda d: edit_config(d, configuration_files=["config.4.0.0rc1.json"]),
         "configuration_files names 'config.4.0.0rc1.json'", "plain releases")
    case("config_files_missing", "hf_odd", lambda d: edit_config(d, configuration_files=["config.4.0.0.json"]),
         "read 'config.4.0.0.json', which is missing")
    # pytorch_model.bin (torch.save's pickle in a zip), read as torch.load(weights_only=True) reads it
    def as_bin(d, obj=None, **save_kw):
        state = load_file(f"{d}/model.safetensors")
        os.remove(f"{d}/model.safetensors")
        torch.save(state if obj is None else obj(state), f"{d}/pytorch_model.bin", **save_kw)

    case("bin_legacy", "hf_odd", lambda d: as_bin(d, _use_new_zipfile_serialization=False),
         "pytorch_model.bin' is not a zip archive", "torch's legacy format")
    case("bin_runs_code", "hf_odd", lambda d: as_bin(d, lambda s: {**s, "model.norm.weight": RunsCode()}),
         "names posix.system", "which ptrain does not run")
    case("bin_not_tensor", "hf_odd", lambda d: as_bin(d, lambda s: {**s, "model.norm.weight": 1.0}),
         "'model.norm.weight' is not a tensor")
    case("bin_float8", "hf_odd", lambda d: as_bin(d, lambda s: {**s, "model.norm.weight": s["model.norm.weight"].to(
        torch.float8_e4m3fn)}), "a tensor of a dtype torch saves with _rebuild_tensor_v3")
    case("bin_view_past_storage", "hf_odd", lambda d: (as_bin(d, lambda s: {**s, "model.norm.weight": torch.cat(
        [torch.zeros(2), s["model.norm.weight"]])[2:]}), shift_norm_view(f"{d}/pytorch_model.bin")),
         "a tensor reading element", "of a storage of")
    case("bin_big_endian", "hf_odd", lambda d: (as_bin(d), rewrite_zip(
        f"{d}/pytorch_model.bin", lambda name, data: b"big" if name.endswith("/byteorder") else data)),
         "a big-endian archive")
    # a base model's names (no "model."): the head is missing unless tied; one name stored twice
    def flat_names(d, drop=(), extra=None):
        t = load_file(f"{d}/model.safetensors")
        t = {k.removeprefix("model."): v for k, v in t.items() if k not in drop}
        t.update(extra(t) if extra else {})
        save_file(t, f"{d}/model.safetensors", metadata={"format": "pt"})

    case("untied_head_only", "hf_odd", lambda d: edit_tensors(d, lambda t: t.pop("model.embed_tokens.weight")),
         "tensor 'model.embed_tokens.weight' is missing")
    case("base_model_untied", "hf_odd", lambda d: flat_names(d, drop=("lm_head.weight",)),
         "tensor 'lm_head.weight' is missing")
    case("base_model_name_twice", "hf_qwen2",
         lambda d: flat_names(d, extra=lambda t: {"model.norm.weight": t["norm.weight"].clone()}),
         "holds both 'model.norm.weight' and 'norm.weight'", "transformers both loads as 'model.norm.weight'")
    case("base_model_stray", "hf_qwen2",
         lambda d: flat_names(d, extra=lambda t: {"layers.0.extra.weight": t["norm.weight"].clone()}),
         "tensor 'model.layers.0.extra.weight' is not part of", "(stored as 'layers.0.extra.weight')")
    weight_file_choice(binary, fixtures, work)
    base_model_names(binary, fixtures, work)
    config_file_choice(binary, fixtures, work)
    tied_head_stored_unequal(binary, fixtures, work)

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
