#!/usr/bin/env python3
"""Writes configs/tiny_preferences.jsonl: synthetic preference pairs for
configs/tiny_dpo_qlora.toml, in TRL's conversational preference format —
{"prompt": [turns], "chosen": [reply], "rejected": [reply]} — with a quarter of the records
leaving the prompt implicit ({"chosen": [turns + reply], "rejected": [turns + reply]}, the turns
they share being the prompt).

Generated from a fixed seed by the tasks of launch/make_chat_data.py (sums, word order,
counting, capitals): the chosen reply is the right answer, the rejected one a plausible wrong
one (a sum off by a little, the words in their first order, a miscount, lower case), so DPO has a
preference to learn and its reward accuracy visibly rises.

    python3 launch/make_preference_data.py [OUT] [--pairs N]
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_data import SYSTEMS, WORDS  # noqa: E402  (the same vocabulary as the chats)


def arithmetic(rng):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    wrong = a + b + rng.choice([-10, -2, -1, 1, 2, 10])
    return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", f"{a} + {b} = {wrong}."


def reverse(rng):
    words = rng.sample(WORDS, rng.randint(2, 5))
    return "Reverse the words: " + " ".join(words), " ".join(reversed(words)), " ".join(words)


def count(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 9))]
    n = len(words)
    wrong = n + rng.choice([-1, 1, 2])
    return "How many words are in: " + " ".join(words), f"There are {n} words.", f"There are {wrong} words."


def capitals(rng):
    words = rng.sample(WORDS, rng.randint(1, 4))
    return "Write in capitals: " + " ".join(words), " ".join(words).upper(), " ".join(words)


TASKS = [arithmetic, reverse, count, capitals]


def pair(rng):
    prompt = []
    if rng.random() < 0.5:
        prompt.append({"role": "system", "content": rng.choice(SYSTEMS)})
    question, good, bad = rng.choice(TASKS)(rng)
    prompt.append({"role": "user", "content": question})
    chosen, rejected = [{"role": "assistant", "content": good}], [{"role": "assistant", "content": bad}]
    if rng.random() < 0.25:
        return {"chosen": prompt + chosen, "rejected": prompt + rejected}
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def main():
    args = sys.argv[1:]
    pairs = 600
    if "--pairs" in args:
        i = args.index("--pairs")
        pairs = int(args[i + 1])
        del args[i:i + 2]
    out = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs",
                                            "tiny_preferences.jsonl")
    rng = random.Random(20261127)
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(pairs):
            f.write(json.dumps(pair(rng)) + "\n")
    print(f"wrote {pairs} preference pairs to {out}")


if __name__ == "__main__":
    main()
