#!/usr/bin/env python3
"""ptrain's supervised fine-tuning against TRL's SFTTrainer, the reference (trl 1.16, run here).

Each case trains 10 steps in float32 on six prompt/completion records (conversational or text)
over a tiny model — the committed Llama 3 with its template (tests/fixtures/hf_chat) or Qwen2
with ChatML (hf_qwen_chat) —, the full model or a PEFT LoRA adapter whose B is drawn non-zero,
starting from the same weights. Every step's global batch is all six records (ptrain: 6 / np a
rank), so the data order cannot differ. Plain AdamW, constant lr, no clipping, no weight decay
on both sides; TRL trains the completions only (completion_only_loss), as ptrain does.

Per step, TRL's logged loss, entropy, mean_token_accuracy (token means over the trained tokens)
and num_tokens (the running count of the ids of every row, prompt included) must equal ptrain's
metrics.jsonl within 1e-5 relative. With gradient accumulation TRL averages its micro-batches'
token means and ptrain gives the token mean of the whole step, so there the loss and num_tokens
are compared.

After the 10 steps, TRL's evaluate() on the same records (one evaluation batch, so its means are
token means) must equal `ptrain eval --json` of ptrain's final checkpoint: eval_loss,
eval_entropy and eval_mean_token_accuracy against mean_loss, entropy and mean_token_accuracy,
within 1e-5 relative.

Text records are compared too: {"prompt", "completion"} strings and {"text"} documents, which
both sides tokenize as HF's tokenizer(prompt + completion + eos_token) (no BOS from hf_chat's
tokenizer; its eos_token <|eot_id|>, Qwen2's <|im_end|>).

    python tests/sweep/sft_trl.py build/ptrain ["name substring"]
"""
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from preference_trl import FIXTURES, LORA_TARGETS, make_adapter, run_ptrain  # noqa: E402

STEPS, ROWS, LR, RTOL = 10, 6, 1e-3, 1e-5
METRICS = ["loss", "entropy", "mean_token_accuracy", "num_tokens"]

# name, model fixture, data kind (records()), lora, gradient accumulation, world sizes
CASES = [
    ("llama3 chat sft full", "hf_chat", "chat", False, 1, [1, 2, 3]),
    ("llama3 chat sft lora", "hf_chat", "chat", True, 1, [1, 3]),
    ("qwen2 chat sft lora", "hf_qwen_chat", "chat", True, 1, [2]),
    ("qwen2 chat sft full accum 2", "hf_qwen_chat", "chat", False, 2, [1, 3]),
    ("llama3 text prompt/completion sft full", "hf_chat", "text", False, 1, [1, 2]),
    ("qwen2 text prompt/completion sft lora", "hf_qwen_chat", "text", True, 1, [3]),
    ("llama3 text documents sft full", "hf_chat", "document", False, 1, [2]),
]


def records(kind):
    """Six records: prompt/completion chats (a system message in every other one) or text, or
    {"text"} documents."""
    out = []
    for i in range(ROWS):
        question, answer = f"What is {i + 2} plus {3 * i}?", f"It is {4 * i + 2}, as {i + 2} + {3 * i} makes."
        if kind == "chat":
            system = [{"role": "system", "content": "Answer briefly."}] if i % 2 else []
            out.append({"prompt": system + [{"role": "user", "content": question}],
                        "completion": [{"role": "assistant", "content": answer}]})
        elif kind == "text":
            out.append({"prompt": f"Q: {question}\nA:", "completion": " " + answer})
        else:
            out.append({"text": f"Q: {question}\nA: {answer}"})
    return out


def trl_run(model_dir, rows, lora, adapter, accum, work):
    """TRL's logged metrics of each step, [{metric: value}], and its evaluate() on `rows` after."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    args = SFTConfig(output_dir=os.path.join(work, "trl"), per_device_train_batch_size=ROWS // accum,
                     gradient_accumulation_steps=accum, max_steps=STEPS, learning_rate=LR,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
                     adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, logging_steps=1, report_to=[],
                     use_cpu=True, save_strategy="no", gradient_checkpointing=False, bf16=False,
                     train_sampling_strategy="sequential", max_length=64, seed=0, optim="adamw_torch",
                     packing=False, per_device_eval_batch_size=ROWS)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    # TRL drops the records whose completion max_length cuts away whole (Qwen's template's long
    # default system message fills the prompt) and trains on a short batch of the rest; ptrain
    # drops them too and fills each step's six rows by going round the kept ones again: the same
    # means, and as many times the ids (num_tokens) as the kept records go into six.
    kept = len(trainer.train_dataset)
    for h in steps:
        h["num_tokens"] *= ROWS / kept
    return steps, trainer.evaluate(Dataset.from_list(rows))


def ptrain_run(binary, model_dir, data, lora, adapter, accum, np, work):
    out = os.path.join(work, f"ptrain_np{np}")
    shutil.rmtree(out, ignore_errors=True)
    sets = {"model.hf_path": model_dir, "data.path": data, "data.format": "jsonl", "data.seq_len": 63,
            "data.packing": "false", "data.micro_batch_size": ROWS // np // accum,
            "training.grad_accum_steps": accum, "data.val_fraction": 0, "data.cache": "false",
            "training.steps": STEPS, "training.log_every": 1, "training.eval_every": 0,
            "training.max_grad_norm": 0, "training.device": "cpu", "optimizer.lr": LR,
            "optimizer.betas": "[0.9, 0.999]", "optimizer.eps": 1e-8, "optimizer.weight_decay": 0,
            "lr_schedule.warmup_steps": 0, "lr_schedule.decay": "constant", "precision.mode": "fp32",
            "run.output_dir": out, "checkpoint.save_final": "true"}
    if lora:
        sets.update({"lora.enabled": "true", "lora.rank": 4, "lora.alpha": 8.0, "lora.dropout": 0.0,
                     "lora.targets": json.dumps(list(LORA_TARGETS)), "lora.adapter_path": adapter})
    return run_ptrain(binary, sets, data, np, work, STEPS)


def compare(name, np, ref, got, metrics):
    if len(ref) != STEPS or len(got) != STEPS:
        sys.exit(f"FAIL {name} np {np}: {len(ref)} TRL steps, {len(got)} ptrain steps, expected {STEPS}")
    worst = (0.0, "")
    for step, (a, b) in enumerate(zip(ref, got), 1):
        for m in metrics:
            if m not in a or m not in b:
                sys.exit(f"FAIL {name} np {np}: step {step}: {m} missing ({'TRL' if m not in a else 'ptrain'})")
            x, y = float(a[m]), float(b[m])
            rel = abs(x - y) / max(abs(x), abs(y), 1e-12)
            if rel > worst[0]:
                worst = (rel, f"step {step} {m}: TRL {x!r}, ptrain {y!r}")
            if rel > RTOL:
                sys.exit(f"FAIL {name} np {np}: step {step} {m}: TRL {x!r}, ptrain {y!r} (relative {rel:.2e})")
    return worst


def compare_eval(name, np, ref, got):
    """TRL's evaluate() against `ptrain eval` of the final checkpoint: the largest relative difference."""
    worst = 0.0
    for theirs, ours in (("eval_loss", "mean_loss"), ("eval_entropy", "entropy"),
                         ("eval_mean_token_accuracy", "mean_token_accuracy")):
        if ours not in got:
            sys.exit(f"FAIL {name} np {np} evaluation: ptrain eval gives no {ours}")
        x, y = float(ref[theirs]), float(got[ours])
        rel = abs(x - y) / max(abs(x), abs(y), 1e-12)
        worst = max(worst, rel)
        if rel > RTOL:
            sys.exit(f"FAIL {name} np {np} evaluation: {theirs}: TRL {x!r}, ptrain eval {y!r} (relative {rel:.2e})")
    return worst


def main():
    warnings.filterwarnings("ignore")
    binary = os.path.abspath(sys.argv[1])
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    ran = 0
    with tempfile.TemporaryDirectory() as work:
        for name, fixture, kind, lora, accum, world_sizes in CASES:
            if only not in name:
                continue
            model_dir = os.path.join(FIXTURES, fixture)
            rows = records(kind)
            data = os.path.join(work, f"{kind}.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            adapter = None
            if lora:
                adapter = os.path.join(work, f"adapter_{fixture}")
                make_adapter(model_dir, adapter)
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                ref, ref_eval = trl_run(model_dir, rows, lora, adapter, accum, work)
            # TRL's token means average its micro-batches' with accumulation: compared without
            metrics = METRICS if accum == 1 else ["loss", "num_tokens"]
            for np in world_sizes:
                got, got_eval = ptrain_run(binary, model_dir, data, lora, adapter, accum, np, work)
                worst, where = compare(name, np, ref, got, metrics)
                worst_eval = compare_eval(name, np, ref_eval, got_eval)
                print(f"PASS {name} np {np}: {', '.join(metrics)} over {STEPS} steps, largest relative "
                      f"difference {worst:.1e} ({where}); evaluation after: loss, entropy, token accuracy "
                      f"{worst_eval:.1e}", flush=True)
                ran += 1
    if ran == 0:
        sys.exit(f"FAIL: no case matches '{only}'")
    print(f"{ran} runs compared with TRL's SFTTrainer, 0 failed")


if __name__ == "__main__":
    main()
