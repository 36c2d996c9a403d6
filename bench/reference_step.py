#!/usr/bin/env python3
"""PyTorch eager reference for bench/step_vs_pytorch.sh: one training step (forward, loss,
backward, clip, AdamW) of the same Llama as ptrain's config, timed over repetitions.

Prints one JSON line: {"median_step_s": ..., "steps": [...], "threads": ...}.
Needs transformers from PyPI in the torch venv (the bench script installs it when missing).
"""
import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--ffn", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--rope-theta", type=float, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True) instead of the default")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=a.dim, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.ffn, vocab_size=a.vocab,
                      max_position_embeddings=max(1024, a.seq), rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, attn_implementation="sdpa", torch_dtype="float32")
    model = LlamaForCausalLM(cfg).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    plain = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=a.fused_adamw or None)
    times = []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"median_step_s": statistics.median(times), "steps": times, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
