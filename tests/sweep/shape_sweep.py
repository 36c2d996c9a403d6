#!/usr/bin/env python3
"""Shape sweep: awkward shapes of every model family through every training mode, checked by
the real clients.

For each shape (odd hidden sizes, vocabularies that are not multiples of 64, MHA and GQA 8:1,
tied embeddings, one layer, head_dim != hidden/heads; Llama with biases, Qwen2 with YaRN, Qwen3
with linear RoPE scaling, Mistral with a sliding window)
this script
  1. makes a random Hugging Face model of its family with transformers (random norm weights and
     biases) and saves it;
  2. checks `ptrain eval` of that model equals transformers' loss on the same windows;
  3. trains it 3 steps with ptrain in fp32, mixed, bf16, LoRA (all projections + output, bf16)
     and QLoRA (NF4 base, same adapters, bf16), each from the HF model — the other families also
     in bf16 with stochastic rounding, with 8-bit AdamW, and QLoRA under activation
     checkpointing;
  4. exports each run — `ptrain export` (HF checkpoint, or PEFT adapter for LoRA) and, for
     LoRA and QLoRA, `ptrain export --merge` — loads the export with transformers / PEFT and
     checks its loss equals `ptrain eval` of the same checkpoint (both in float32).

Usage: shape_sweep.py PTRAIN_BINARY WORK_DIR [SHAPE ...]
Needs transformers and peft (launch/setup.sh installs them into the torch venv). Prints one
line per check and `N passed, N failed` at the end; exit 1 when any check failed.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SEQ, BATCH, STEPS = 16, 2, 3
SHAPES = {
    # GQA 3:1, nothing a multiple of 64 or 256 (the failing shape)
    "odd96": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=211,
                  vocab_size=300, num_hidden_layers=2),
    # MHA, one layer, tied embedding and output, vocabulary 77
    "mha_tied_1layer": dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=5, intermediate_size=130,
                            vocab_size=77, num_hidden_layers=1, tie_word_embeddings=True),
    # GQA 8:1, vocabulary 1000
    "gqa8": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=1, intermediate_size=333,
                 vocab_size=1000, num_hidden_layers=2),
    # head_dim 24 with hidden 72 and 4 heads (72 / 4 = 18)
    "head_dim24": dict(hidden_size=72, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                       intermediate_size=190, vocab_size=131, num_hidden_layers=2),
    # the other families (model/family.h)
    "llama_bias": dict(hidden_size=72, num_attention_heads=4, num_key_value_heads=2, head_dim=24, intermediate_size=190,
                       vocab_size=259, num_hidden_layers=2, attention_bias=True, mlp_bias=True),
    # Qwen2 with YaRN as Qwen2.5's model cards add it (factor 4 over an original context of 16)
    "qwen2_tied": dict(model_type="qwen2", hidden_size=84, num_attention_heads=6, num_key_value_heads=2,
                       intermediate_size=150, vocab_size=311, num_hidden_layers=2, tie_word_embeddings=True,
                       rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                                            rope_theta=1000000.0)),
    # Qwen3 with linear RoPE scaling (position interpolation)
    "qwen3": dict(model_type="qwen3", hidden_size=64, num_attention_heads=6, num_key_value_heads=2, head_dim=20,
                  intermediate_size=130, vocab_size=257, num_hidden_layers=2,
                  rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1000000.0)),
    "mistral": dict(model_type="mistral", hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
                    intermediate_size=200, vocab_size=333, num_hidden_layers=2, sliding_window=5),  # applies: SEQ 16
}
MODES = ["fp32", "mixed", "bf16", "lora", "qlora"]
FAMILY_MODES = MODES + ["bf16-sr", "adamw8bit", "qlora-ckpt"]  # for the shapes of the other families
LORA_TARGETS = ["q", "k", "v", "o", "gate", "up", "down", "output"]

passed, failed = 0, 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    if p.returncode != 0:
        print("$ " + " ".join(cmd) + f"\nexit {p.returncode}\n{p.stdout}{p.stderr}", flush=True)
    return p


def write_tokens(path, ids, vocab):
    """ptrain's token file: 32-byte header (magic, version 1, width 2, count, vocab), uint16 ids."""
    with open(path, "wb") as f:
        f.write(b"PTRAINTK" + struct.pack("<IIQI", 1, 2, len(ids), vocab) + bytes(4))
        f.write(torch.tensor(ids, dtype=torch.int16).numpy().tobytes())


def windows_loss(model, ids):
    """Mean next-token loss over consecutive non-overlapping SEQ+1 windows (`ptrain eval`'s order)."""
    n = len(ids) // (SEQ + 1)
    w = torch.tensor(ids[: n * (SEQ + 1)]).view(n, SEQ + 1)
    with torch.no_grad():
        logits = model(input_ids=w[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1)).item()


def lora_targets(dims):
    # A tied output projection is the embedding: ptrain refuses an adapter on it.
    return LORA_TARGETS[:-1] if dims.get("tie_word_embeddings") else LORA_TARGETS


def modes_of(dims):
    return FAMILY_MODES if dims.get("model_type", "llama") != "llama" or dims.get("attention_bias") else MODES


def is_adapter(mode):
    return mode in ("lora", "qlora", "qlora-ckpt")


def config_toml(shape_dir, mode, dims):
    lines = [
        "[run]", 'name = "sweep"', f'output_dir = "{shape_dir}/{mode}"', "seed = 3",
        "[model]", f'hf_path = "{shape_dir}/hf"',
        "[data]", f'path = "{shape_dir}/train.bin"', 'format = "tokens"', f"seq_len = {SEQ}",
        f"micro_batch_size = {BATCH}", "val_fraction = 0.0",
        "[training]", f"steps = {STEPS}", "log_every = 1", "eval_every = 0", 'device = "cpu"', "max_grad_norm = 1.0",
        "[optimizer]", f"lr = {1e-2 if is_adapter(mode) else 1e-3}",
        f'name = "{"adamw8bit" if mode == "adamw8bit" else "adamw"}"',
        "[lr_schedule]", 'decay = "constant"',
        "[memory]", "loss_chunk_tokens = 19",
        f'activation_checkpointing = "{"full" if mode == "qlora-ckpt" else "none"}"',
        "[precision]", f'mode = "{ {"fp32": "fp32", "mixed": "mixed"}.get(mode, "bf16") }"',
        f"stochastic_rounding = {'true' if mode == 'bf16-sr' else 'false'}",
    ]
    if is_adapter(mode):
        lines += ["[lora]", "enabled = true", "rank = 4", "alpha = 8.0",
                  "targets = [" + ", ".join(f'"{t}"' for t in lora_targets(dims)) + "]"]
    if mode in ("qlora", "qlora-ckpt"):
        lines += ["[quant]", 'base = "nf4"', "double_quant = true"]
    path = f"{shape_dir}/{mode}.toml"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def ptrain_eval(binary, cfg, data, checkpoint=None):
    cmd = [binary, "eval", "--config", cfg, "--data", data, "--json", "--set", 'precision.mode="fp32"',
           "--set", "precision.stochastic_rounding=false"]
    if checkpoint:
        cmd += ["--checkpoint", checkpoint]
    p = run(cmd)
    return json.loads(p.stdout.strip().splitlines()[-1])["mean_loss"] if p.returncode == 0 else math.nan


def close(a, b, tol=2e-5):
    return abs(a - b) <= tol * max(1.0, abs(b))


def sweep_shape(binary, work, name, dims):
    shape_dir = os.path.join(work, name)
    shutil.rmtree(shape_dir, ignore_errors=True)  # a checkpoint left there would be resumed
    os.makedirs(shape_dir)
    torch.manual_seed(11)
    dims = dict(dims)
    model_type = dims.pop("model_type", "llama")
    config = AutoConfig.for_model(model_type, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.05,
                                  attn_implementation="eager", **dims)
    base = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for n, p in base.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    base.save_pretrained(f"{shape_dir}/hf")
    vocab = dims["vocab_size"]
    g = torch.Generator().manual_seed(5)
    write_tokens(f"{shape_dir}/train.bin", torch.randint(0, vocab, (4000,), generator=g).tolist(), vocab)
    eval_ids = torch.randint(0, vocab, (6 * (SEQ + 1),), generator=g).tolist()
    write_tokens(f"{shape_dir}/eval.bin", eval_ids, vocab)

    ref = windows_loss(base, eval_ids)
    got = ptrain_eval(binary, config_toml(shape_dir, "fp32", dims), f"{shape_dir}/eval.bin")
    check(close(got, ref), f"{name} ({model_type}): ptrain eval of the HF model {got:.6f} = transformers {ref:.6f}")

    def hf_loss_of(directory):
        return windows_loss(AutoModelForCausalLM.from_pretrained(directory).eval(), eval_ids)

    for mode in modes_of(dims):
        cfg = config_toml(shape_dir, mode, dims)
        t0 = time.time()
        p = run([binary, "--config", cfg])
        losses = []
        if p.returncode == 0:
            with open(f"{shape_dir}/{mode}/metrics.jsonl") as f:
                losses = [json.loads(l)["loss"] for l in f if '"loss"' in l]
        if not check(p.returncode == 0 and len(losses) == STEPS and all(math.isfinite(x) for x in losses),
                     f"{name}/{mode}: trains {STEPS} steps, losses {[round(x, 4) for x in losses]} "
                     f"({time.time() - t0:.1f} s)"):
            continue
        ckpt = f"{shape_dir}/{mode}/checkpoints/step_{STEPS}"
        trained = ptrain_eval(binary, cfg, f"{shape_dir}/eval.bin", ckpt)
        out = f"{shape_dir}/{mode}/export"
        if not check(run([binary, "export", "--checkpoint", ckpt, "--out", out]).returncode == 0, f"{name}/{mode}: exports"):
            continue
        if not is_adapter(mode):
            hf_loss = hf_loss_of(out)
            check(close(hf_loss, trained), f"{name}/{mode}: transformers' loss of the exported checkpoint "
                                           f"{hf_loss:.6f} = ptrain eval of the checkpoint {trained:.6f}")
            continue
        from peft import PeftModel
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(f"{shape_dir}/hf"), out).eval()
        with open(f"{out}/adapter_config.json") as f:
            targets = json.load(f)["target_modules"]
        trained_lora = sum(1 for n, _ in adapted.named_parameters() if "lora_B" in n)
        expected_modules = 7 * dims["num_hidden_layers"] + ("output" in lora_targets(dims))
        check(trained_lora == expected_modules,
              f"{name}/{mode}: PEFT loads the adapter onto the HF base ({trained_lora} adapted modules, "
              f"targets {sorted(targets)})")
        check(math.isfinite(trained) and not close(trained, ref, 1e-6), f"{name}/{mode}: the trained adapter changes the loss "
                                                                         f"({ref:.6f} -> {trained:.6f})")
        if mode == "lora":  # the adapter on the full-precision base: PEFT computes what ptrain trained
            peft_loss = windows_loss(adapted, eval_ids)
            check(close(peft_loss, trained), f"{name}/{mode}: PEFT's loss with the exported adapter {peft_loss:.6f} "
                                             f"= ptrain eval of the checkpoint {trained:.6f}")
        merged = f"{shape_dir}/{mode}/merged"
        if check(run([binary, "export", "--merge", "--checkpoint", ckpt, "--out", merged]).returncode == 0,
                 f"{name}/{mode}: export --merge"):
            hf_loss = hf_loss_of(merged)
            check(close(hf_loss, trained), f"{name}/{mode}: transformers' loss of the merged {'NF4+' if 'q' in mode else ''}"
                                           f"LoRA export {hf_loss:.6f} = ptrain eval of the checkpoint {trained:.6f}")


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or list(SHAPES)
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    t0 = time.time()
    for name in names:
        sweep_shape(binary, work, name, SHAPES[name])
    print(f"shape sweep: {len(names)} shapes in {time.time() - t0:.0f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
