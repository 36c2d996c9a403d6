#!/usr/bin/env python3
"""Chat fine-tuning, checked end to end by the real clients.

  1. QLoRA-trains the chat fixture model (tests/fixtures/hf_chat: weights + tokenizer.json) with
     configs/tiny_chat_qlora.toml on chats from launch/make_chat_data.py, a few steps;
  2. `ptrain export --merge` folds the adapters into the dequantized base (an HF model directory);
  3. `ptrain eval --data held_out.jsonl` (float32, one chat per row) scores the held-out chats'
     answer tokens;
  4. transformers loads the merged model and the fixture's tokenizer, renders the same chats
     with `apply_chat_template` (Llama 3 Instruct's template), sets labels -100 outside the
     assistant replies, and its loss summed over the chats must equal ptrain's: the same
     number of trained tokens exactly, the mean loss within 1e-4 relative — one chat per row, and
     packed (several chats per row, each with its own positions and attention).

Usage: chat_roundtrip.py PTRAIN_BINARY SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from chat_labels import chat_ids_and_labels  # noqa: E402  (the fixture scripts' reference)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} -> rc {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def main():
    binary, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    train_data, held_out = os.path.join(work, "chats.jsonl"), os.path.join(work, "held_out.jsonl")
    run([sys.executable, os.path.join(src, "launch/make_chat_data.py"), train_data, "--chats", "400"])
    with open(train_data) as f:
        lines = f.readlines()
    with open(held_out, "w") as f:
        f.writelines(lines[-24:])
    model_dir = os.path.join(src, "tests/fixtures/hf_chat")
    common = ["--config", os.path.join(src, "configs/tiny_chat_qlora.toml"), "--set", f"model.hf_path={model_dir}",
              "--set", "training.device=cpu"]
    run([binary] + common + ["--set", f"data.path={train_data}", "--set", f"run.output_dir={work}/run",
                             "--set", "training.steps=25", "--set", "training.eval_every=0"])
    ckpt = os.path.join(work, "run/checkpoints/step_25")
    run([binary, "export", "--checkpoint", ckpt, "--out", os.path.join(work, "merged"), "--merge"])
    def evaluate(packing):
        return json.loads(run([binary, "eval"] + common + ["--checkpoint", ckpt, "--data", held_out, "--json",
                                                           "--set", 'precision.mode="fp32"', "--set", f"data.packing={packing}"]))
    got, packed = evaluate("false"), evaluate("true")

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(os.path.join(work, "merged"), torch_dtype=torch.float32).eval()
    total, tokens = 0.0, 0
    with open(held_out) as f:
        for line in f:
            ids, labels = chat_ids_and_labels(tok, json.loads(line)["messages"])
            n = sum(1 for l in labels[1:] if l != -100)
            with torch.no_grad():
                loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item()
            total += loss * n
            tokens += n
    want = total / tokens
    print(f"held-out answer tokens: ptrain {got['tokens']} ({packed['tokens']} packed into {packed['rows']} rows), "
          f"transformers {tokens}; mean loss ptrain {got['mean_loss']:.6f} ({packed['mean_loss']:.6f} packed), "
          f"transformers {want:.6f}")
    ok = all(g["tokens"] == tokens and abs(g["mean_loss"] - want) <= 1e-4 * abs(want) for g in (got, packed))
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
