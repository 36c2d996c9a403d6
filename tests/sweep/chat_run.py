"""What the chat round trips share: running ptrain, and a short QLoRA run of
configs/tiny_chat_qlora.toml on generated chats with some held out."""
import os
import shutil
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from chat_labels import chat_ids_and_labels  # noqa: E402  (the fixture scripts' reference)


def run(cmd):
    """cmd's stdout; exits the test with its output when it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} -> rc {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def train_chats(binary, src, work, model_dir, steps, held_out_chats):
    """Trains configs/tiny_chat_qlora.toml over `model_dir` for `steps` steps on 400 chats from
    launch/make_chat_data.py in a fresh `work`; returns (common ptrain arguments, the last
    checkpoint, a JSONL file of the last `held_out_chats` chats)."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    train_data, held_out = os.path.join(work, "chats.jsonl"), os.path.join(work, "held_out.jsonl")
    run([sys.executable, os.path.join(src, "launch/make_chat_data.py"), train_data, "--chats", "400"])
    with open(train_data) as f:
        lines = f.readlines()
    with open(held_out, "w") as f:
        f.writelines(lines[-held_out_chats:])
    common = ["--config", os.path.join(src, "configs/tiny_chat_qlora.toml"), "--set", f"model.hf_path={model_dir}",
              "--set", "training.device=cpu"]
    run([binary] + common + ["--set", f"data.path={train_data}", "--set", f"run.output_dir={work}/run",
                             "--set", f"training.steps={steps}", "--set", "training.eval_every=0"])
    return common, os.path.join(work, f"run/checkpoints/step_{steps}"), held_out


def mean_answer_loss(model, tok, chats):
    """transformers' mean loss over the chats' reply tokens (chat_labels: the template, labels
    -100 elsewhere), one chat per forward; and the number of those tokens."""
    total, tokens = 0.0, 0
    for messages in chats:
        ids, labels = chat_ids_and_labels(tok, messages)
        n = sum(1 for label in labels[1:] if label != -100)
        with torch.no_grad():
            total += model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item() * n
        tokens += n
    return total / tokens, tokens
