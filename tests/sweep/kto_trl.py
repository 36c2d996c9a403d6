#!/usr/bin/env python3
"""ptrain's KTO (training.objective = "kto") against TRL 1.16's KTOTrainer, the reference, run here.

Each case trains 10 steps in float32 over a tiny model (the committed Llama 3 with its template,
tests/fixtures/hf_chat, or Qwen2 with ChatML, hf_qwen_chat) from the same weights: a LoRA adapter
whose B is drawn non-zero (so the policy and its reference, the base with the adapter off, differ
from step 1), or the full model (its reference precomputed, TRL's precompute_ref_log_probs, or
another model: TRL's ref_model). The data: twelve unpaired examples ({prompt, completion, label},
chats or text, desirable and undesirable in an uneven order), or six preference pairs that both
unpair (TRL's unpair_preference_dataset). KTO reads its examples in order (TRL's sequential
sampler): step s of micro-batch B on rank r reads block (s * accum + a) * np + r, and each block's
KL completions are its own completions rotated by one; at np > 1 TRL runs as np processes
(torch.distributed.run, gloo), the KL term averaged over them each micro-step as ptrain's ranks do.
(Where an epoch's blocks do not divide among the processes, accelerate pads the last ones with the
epoch's first examples and ptrain's ranks read the next blocks: the cases' epochs divide.)

Per step, TRL's logged loss, kl, rewards/chosen, rewards/rejected, rewards/margins, logps/chosen,
logps/rejected, logits/chosen, logits/rejected and entropy must equal ptrain's metrics.jsonl within
1e-5 relative (rewards and margins relative to the log-probabilities they are beta times a
difference of); and at np = 1 TRL's evaluate() after training (the same examples as its eval
dataset) = `ptrain eval` of the final checkpoint.

    python tests/sweep/kto_trl.py build/ptrain
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from preference_trl import (FIXTURES, LORA_TARGETS, make_adapter, make_ref_model, pairs,  # noqa: E402
                            run_ptrain)

STEPS, LR, RTOL = 10, 1e-3, 1e-5
METRICS = ["loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected",
           "logits/chosen", "logits/rejected", "entropy"]
# KTOTrainer's running count of the ids trained on (the examples' attention masks, not the KL
# rows', summed over every micro-batch and process), compared at each step (its evaluation logs the
# training count again; ptrain's evaluation does not)
STEP_METRICS = METRICS + ["num_tokens"]
# name, model, data, [preference] keys (and "micro": examples a micro-batch, "accum", "lr"), lora, world sizes
CASES = [
    ("llama3 chat kto lora", "hf_chat", "chat", {"micro": 4}, True, [1, 3]),
    ("llama3 chat kto lora accum 3", "hf_chat", "chat", {"micro": 2, "accum": 3}, True, [2]),
    ("llama3 text kto lora, weights", "hf_chat", "text",
     {"micro": 3, "desirable_weight": 1.5, "undesirable_weight": 0.7, "beta": 0.3}, True, [1]),
    # (Qwen2.5's template's default system message: room for every prompt, so that the twelve
    # examples are three whole blocks, one step at np 3)
    ("qwen2 paired chat kto lora", "hf_qwen_chat", "paired_chat", {"micro": 4, "lr": 1e-2, "seq_len": 159}, True,
     [3]),
    ("llama3 paired text (implicit prompt) kto lora", "hf_chat", "paired_text_implicit", {"micro": 6}, True, [1]),
    ("llama3 chat apo_zero_unpaired lora", "hf_chat", "chat", {"micro": 3, "loss_type": "apo_zero_unpaired"}, True,
     [1, 2]),
    # (TRL's precompute_ref_log_probs fails in several processes — one reads the cache file another
    # is writing —; ptrain's precomputed reference at np 2 is the ref_model case's, which TRL scores
    # each step)
    ("llama3 chat kto full precompute", "hf_chat", "chat", {"micro": 3}, False, [1]),
    ("qwen2 chat kto lora, ref_model", "hf_qwen_chat", "chat", {"micro": 6, "ref_model": "noisy", "seq_len": 159},
     True, [1, 2]),
]


def examples(kind):
    """KTO records: twelve unpaired examples (labels in an uneven order), or six pairs."""
    if kind.startswith("paired_"):
        return pairs(kind[len("paired_"):])
    labels = [True, True, False, True, False, False, False, True, True, False, True, False]
    out = []
    for i, record in enumerate(pairs(kind)):
        for j, side in enumerate(("chosen", "rejected")):
            out.append({"prompt": record["prompt"], "completion": record[side], "label": labels[2 * i + j]})
    return out


def trl_main(spec_path):
    """One TRL run (a process of torch.distributed.run at np > 1): its per-step logs and evaluation."""
    spec = json.load(open(spec_path))
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig, KTOTrainer
    pref = spec["pref"]
    tok = AutoTokenizer.from_pretrained(spec["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    if spec["lora"]:
        model = PeftModel.from_pretrained(model, spec["adapter"], is_trainable=True)
    ref_model = AutoModelForCausalLM.from_pretrained(pref["ref_model"], dtype=torch.float32) \
        if "ref_model" in pref else None
    args = KTOConfig(output_dir=os.path.join(spec["work"], "trl"), per_device_train_batch_size=pref["micro"],
                     per_device_eval_batch_size=pref["micro"], gradient_accumulation_steps=pref.get("accum", 1),
                     max_steps=STEPS, learning_rate=pref.get("lr", LR), lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, max_grad_norm=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                     logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", gradient_checkpointing=False,
                     bf16=False, max_length=pref.get("seq_len", 63) + 1, seed=0, optim="adamw_torch", beta=pref.get("beta", 0.1),
                     loss_type=pref.get("loss_type", "kto"), desirable_weight=pref.get("desirable_weight", 1.0),
                     undesirable_weight=pref.get("undesirable_weight", 1.0),
                     precompute_ref_log_probs=not spec["lora"] and ref_model is None, dataloader_drop_last=False)
    rows = spec["rows"]
    trainer = KTOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
                         eval_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    evaluation = trainer.evaluate()
    if int(os.environ.get("RANK", "0")) == 0:
        with open(spec["out"], "w") as f:
            json.dump({"steps": steps, "eval": evaluation}, f)


def trl_run(model_dir, rows, pref, lora, adapter, np, work):
    spec = os.path.join(work, "trl_spec.json")
    out = os.path.join(work, f"trl_np{np}.json")
    with open(spec, "w") as f:
        json.dump({"model": model_dir, "rows": rows, "pref": pref, "lora": lora, "adapter": adapter, "work": work,
                   "out": out}, f)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, __file__, "--trl", spec]
    if np > 1:  # a port free now (a run's port may still be closing when the next starts)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np), "--master_port",
               str(port)] + cmd[1:]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if r.returncode != 0:
        sys.exit(f"FAIL: TRL np {np} -> rc {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-4000:]}")
    result = json.load(open(out))
    return result["steps"], result["eval"]


def ptrain_run(binary, model_dir, data, pref, lora, adapter, np, work):
    out = os.path.join(work, f"ptrain_np{np}")
    shutil.rmtree(out, ignore_errors=True)
    sets = {"model.hf_path": model_dir, "data.path": data, "data.format": "jsonl", "data.seq_len": pref.get("seq_len", 63),
            "data.micro_batch_size": pref["micro"], "training.grad_accum_steps": pref.get("accum", 1),
            "data.val_fraction": 0, "data.cache": "false", "training.objective": "kto", "training.steps": STEPS,
            "training.log_every": 1, "training.eval_every": 0, "training.max_grad_norm": 0,
            "training.device": "cpu", "optimizer.lr": pref.get("lr", LR), "optimizer.betas": "[0.9, 0.999]",
            "optimizer.eps": 1e-8, "optimizer.weight_decay": 0, "lr_schedule.warmup_steps": 0,
            "lr_schedule.decay": "constant", "precision.mode": "fp32", "run.output_dir": out,
            "checkpoint.save_final": "true"}
    if lora:
        sets.update({"lora.enabled": "true", "lora.rank": 4, "lora.alpha": 8.0, "lora.dropout": 0.0,
                     "lora.targets": json.dumps(list(LORA_TARGETS)), "lora.adapter_path": adapter})
    for k, v in pref.items():
        if k not in ("micro", "accum", "lr", "seq_len"):
            sets[f"preference.{k}"] = v
    return run_ptrain(binary, sets, data, np, work, STEPS)


def relative(m, x, y, record, beta, prefix=""):
    # the rewards are beta times, and the KL term a mean of, differences of log-probability sums:
    # their float32 rounding is that of the sums; the mean logits are means of logits of either
    # sign, near 0, whose rounding is that of the logits (preference_trl.floor_of: 1e-2)
    logps = max(abs(record.get(prefix + "logps/chosen", 0.0)), abs(record.get(prefix + "logps/rejected", 0.0)))
    floor = beta * logps if m.startswith(prefix + "rewards/") else logps if m == prefix + "kl" else \
        1e-2 if m.startswith(prefix + "logits/") else 0.0
    return abs(x - y) / max(abs(x), abs(y), floor, 1e-12)


def compare(name, np, ref, got, beta):
    if len(ref) != STEPS or len(got) != STEPS:
        sys.exit(f"FAIL {name} np {np}: {len(ref)} TRL steps, {len(got)} ptrain steps")
    worst = (0.0, "")
    for step, (a, b) in enumerate(zip(ref, got), start=1):
        for m in STEP_METRICS:
            if (m in a) != (m in b):
                sys.exit(f"FAIL {name} np {np} step {step}: {m} logged by {'TRL' if m in a else 'ptrain'} only")
            if m not in a:
                continue
            rel = relative(m, float(a[m]), float(b[m]), a, beta)
            if rel > RTOL:
                sys.exit(f"FAIL {name} np {np} step {step}: {m}: TRL {a[m]!r}, ptrain {b[m]!r} (relative {rel:.2e})")
            worst = max(worst, (rel, f"step {step} {m}"))
    return worst


def compare_eval(name, ref, got, beta):
    worst = 0.0
    for m in METRICS:
        key = "eval_" + m
        if (key in ref) != (key in got):
            sys.exit(f"FAIL {name} evaluation: {key} given by {'TRL' if key in ref else 'ptrain'} only")
        if key not in ref:
            continue
        rel = relative(key, float(ref[key]), float(got[key]), ref, beta, "eval_")
        if rel > RTOL:
            sys.exit(f"FAIL {name} evaluation: {key}: TRL {ref[key]!r}, ptrain eval {got[key]!r} (relative {rel:.2e})")
        worst = max(worst, rel)
    return worst


def main():
    binary = os.path.abspath(sys.argv[1])
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    with tempfile.TemporaryDirectory() as work:
        compared = 0
        for name, model_name, kind, pref, lora, sizes in CASES:
            if only and only not in name:
                continue
            d = os.path.join(work, name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", ""))
            os.makedirs(d)
            model_dir = os.path.join(FIXTURES, model_name)
            adapter = None
            if lora:
                adapter = os.path.join(d, "adapter")
                make_adapter(model_dir, adapter)
            pref = dict(pref)
            if pref.get("ref_model") == "noisy":
                pref["ref_model"] = os.path.join(d, "ref_model")
                make_ref_model(model_dir, pref["ref_model"], "noisy")
            rows = examples(kind)
            data = os.path.join(d, "data.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            for np in sizes:
                ref, ref_eval = trl_run(model_dir, rows, pref, lora, adapter, np, d)
                got, got_eval = ptrain_run(binary, model_dir, data, pref, lora, adapter, np, d)
                rel, where = compare(name, np, ref, got, pref.get("beta", 0.1))
                # `ptrain eval` runs as one process; TRL's evaluate() at np > 1 averages its metrics
                # over batches of all processes' examples, as one process does not
                evaluated = ""
                if np == 1:
                    evaluated = f"; evaluation {compare_eval(name, ref_eval, got_eval, pref.get('beta', 0.1)):.1e}"
                compared += 1
                print(f"PASS {name} np {np}: {STEPS} steps of {len(STEP_METRICS)} metrics = TRL's KTOTrainer, worst "
                      f"relative difference {rel:.1e} ({where}){evaluated}", flush=True)
        print(f"{compared} runs compared, 0 failed")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--trl":
        trl_main(sys.argv[2])
    else:
        main()
