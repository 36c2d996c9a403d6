#!/usr/bin/env python3
"""PyTorch FSDP2 reference for bench/speed_vs_fsdp2.sh: trains the same Llama as a ptrain
config (shape, batch, seq_len, precision mode, AdamW settings, activation checkpointing) with
`fully_shard` per decoder layer + root and a `MixedPrecisionPolicy`, at world size 1, eager or
with each layer `torch.compile`d (torchtitan's recipe), and reports what ptrain's metrics.jsonl
reports: tokens/s, TFLOP/s with the same FLOP count, peak allocated memory.

Precision modes, as ptrain's table:
  fp32   fp32 params, compute and reduce
  mixed  fp32 params (master), bf16 compute / all-gather, fp32 reduce
  bf16   bf16 params, compute and reduce, bf16 AdamW states; logits and loss in fp32

Prints one JSON line: {"tokens_per_s", "step_time_s", "tflops", "peak_mem_bytes",
"peak_mem_source", "device", "variant", ...} (medians over the timed steps).
Needs transformers (launch/setup.sh installs it into the torch venv).
"""
import argparse
import json
import os
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from step_timing import timed_steps


def flops_per_token(cfg, seq):
    """6 N (N without the embedding table, as ptrain's flops_params) + causal attention 12 L d T."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    q_dim = cfg.num_attention_heads * head_dim
    kv_dim = cfg.num_key_value_heads * head_dim
    block = cfg.hidden_size * (q_dim + 2 * kv_dim) + q_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size
    n = cfg.num_hidden_layers * block + cfg.vocab_size * cfg.hidden_size  # output projection
    return 6.0 * n + 12.0 * cfg.num_hidden_layers * q_dim * seq


def main():
    ap = argparse.ArgumentParser()
    for k in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab", "batch", "seq"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--mode", choices=["fp32", "mixed", "bf16"], default="mixed")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer before sharding")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    device = torch.device(a.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)  # set_device needs an index
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=a.dim, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.ffn, vocab_size=a.vocab,
                      max_position_embeddings=max(8192, a.seq), rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                      tie_word_embeddings=a.tied, attn_implementation="sdpa")
    param_dtype = torch.bfloat16 if a.mode == "bf16" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(param_dtype)
    if a.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = MixedPrecisionPolicy(param_dtype=None if a.mode == "fp32" else torch.bfloat16,
                                  reduce_dtype=torch.bfloat16 if a.mode == "bf16" else torch.float32)
    for i, layer in enumerate(model.model.layers):
        if a.compile:
            layer.compile()
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    plain = [p for p in model.parameters() if p.dim() < 2]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused or None)

    g = torch.Generator().manual_seed(1)

    def train_step(tokens):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_grad_norm)
        opt.step()
        return loss

    step_s, peak, source, last_loss = timed_steps(
        device, a.warmup, a.steps, lambda: torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(device),
        train_step)
    tps = a.batch * a.seq / step_s
    print(json.dumps({"variant": ("compiled" if a.compile else "eager"), "mode": a.mode,
                      "activation_checkpointing": a.activation_checkpointing, "device": str(device),
                      "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      "step_time_s": step_s, "tokens_per_s": tps, "tflops": tps * flops_per_token(cfg, a.seq) / 1e12,
                      "peak_mem_bytes": peak, "peak_mem_source": source, "final_loss": last_loss}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
