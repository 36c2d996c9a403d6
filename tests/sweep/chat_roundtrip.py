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
import sys

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_run import mean_answer_loss, run, train_chats  # noqa: E402  (chat_labels: the fixtures' reference)


def main():
    binary, src, work = sys.argv[1:4]
    model_dir = os.path.join(src, "tests/fixtures/hf_chat")
    common, ckpt, held_out = train_chats(binary, src, work, model_dir, steps=25, held_out_chats=24)
    run([binary, "export", "--checkpoint", ckpt, "--out", os.path.join(work, "merged"), "--merge"])
    def evaluate(packing):
        return json.loads(run([binary, "eval"] + common + ["--checkpoint", ckpt, "--data", held_out, "--json",
                                                           "--set", 'precision.mode="fp32"', "--set", f"data.packing={packing}"]))
    got, packed = evaluate("false"), evaluate("true")

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(os.path.join(work, "merged"), torch_dtype=torch.float32).eval()
    with open(held_out) as f:
        want, tokens = mean_answer_loss(model, tok, [json.loads(line)["messages"] for line in f])
    print(f"held-out answer tokens: ptrain {got['tokens']} ({packed['tokens']} packed into {packed['rows']} rows), "
          f"transformers {tokens}; mean loss ptrain {got['mean_loss']:.6f} ({packed['mean_loss']:.6f} packed), "
          f"transformers {want:.6f}")
    ok = all(g["tokens"] == tokens and abs(g["mean_loss"] - want) <= 1e-4 * abs(want) for g in (got, packed))
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
