#!/usr/bin/env python3
"""PEFT + bitsandbytes reference for bench/qlora_vs_peft.sh: QLoRA on one GPU as its users run it
today — transformers' Llama with every projection of the blocks a bitsandbytes `Linear4bit` (NF4,
double quantization as the ptrain config says, bf16 compute: bitsandbytes' own CUDA kernels),
PEFT LoRA adapters on the same projections with the same rank, alpha and dropout, gradient
checkpointing (non-reentrant) when the ptrain config checkpoints, AdamW (torch's fused one) over
the adapters, gradient clipping at 1.0 — and reports what ptrain's metrics.jsonl reports:
tokens/s and the CUDA allocator's peak over the timed steps.

The base is random (the weights do not change the speed): built in bf16 on the device, then each
projection quantized in place as transformers' bitsandbytes loader quantizes it (a `Params4bit`
moved to the device) and its bf16 copy freed, so the peak of the timed steps holds what training
holds. Embeddings, norms and the output layer stay bf16 (ptrain's bf16 mode); `--prepare` runs
PEFT's `prepare_model_for_kbit_training` first instead, which casts them to float32 as the QLoRA
recipes do.

Prints one JSON line: {"label", "tokens_per_s", "step_time_s", "peak_mem_bytes", "peak_mem_source",
"versions", ...} (medians over the timed steps).
"""
import argparse
import json
import time

import torch

from step_timing import timed_steps

PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
               "down": "down_proj"}


def quantize_blocks(model, double_quant, device):
    """Every projection of the decoder blocks as a bitsandbytes NF4 Linear4bit (bf16 compute)."""
    import bitsandbytes as bnb

    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=torch.bfloat16, compress_statistics=double_quant,
                                      quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(child.weight.data.to("cpu" if device.type == "cpu" else device),
                                             requires_grad=False, compress_statistics=double_quant,
                                             quant_type="nf4").to(device)
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, q)
                del child
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    for k in ("dim", "layers", "heads", "kv-heads", "ffn", "vocab", "batch", "seq", "rank"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--alpha", type=float, required=True)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--targets", default="q,k,v,o,gate,up,down", help="ptrain's lora.targets, comma-separated")
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--double-quant", action="store_true")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--prepare", action="store_true", help="peft.prepare_model_for_kbit_training (float32 upcasts)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    import bitsandbytes
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    targets = [PROJECTIONS[t] for t in a.targets.split(",")]
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=a.dim, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, intermediate_size=a.ffn, vocab_size=a.vocab,
                      max_position_embeddings=max(8192, a.seq), rope_theta=a.rope_theta, rms_norm_eps=1e-5,
                      tie_word_embeddings=a.tied, attn_implementation="sdpa", use_cache=False)
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    quantize_blocks(model, a.double_quant, device)
    build_s = time.perf_counter() - t0
    if a.prepare:
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if a.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout,
                                             target_modules=targets, bias="none", task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.999), weight_decay=0.0,
                            fused=device.type == "cuda" or None)

    g = torch.Generator().manual_seed(1)

    def train_step(tokens):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        return loss

    step_s, peak, source, last_loss = timed_steps(
        device, a.warmup, a.steps, lambda: torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device),
        train_step)
    print(json.dumps({"label": "PEFT + bitsandbytes" + (" (prepare_model_for_kbit_training)" if a.prepare else ""),
                      "device": str(device),
                      "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                      "step_time_s": step_s, "tokens_per_s": a.batch * a.seq / step_s, "peak_mem_bytes": peak,
                      "peak_mem_source": source, "final_loss": last_loss, "build_s": build_s,
                      "trainable_params": sum(p.numel() for p in trainable),
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__}}))


if __name__ == "__main__":
    main()
