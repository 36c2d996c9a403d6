#!/usr/bin/env python3
"""Writes data/tiny_chat.jsonl: synthetic chats for configs/tiny_chat_qlora.toml (or, to an
OUT ending in .parquet, the same chats as a ShareGPT Parquet file — a "conversations" column of
{from, value} turns — for configs/tiny_qwen_chat_qlora.toml; that needs pyarrow, which the
project venv has).

Generated here from a fixed seed, so no third-party text is involved and every machine gets
the same file. Each line is {"messages": [...]} in the roles Llama 3 Instruct uses; the
assistant's answers follow from the question by a rule (sums, word order, counting, capitals),
so a small model can learn them and the loss on answer tokens visibly falls.

    python3 launch/make_chat_data.py [OUT] [--chats N]
    $PTRAIN_VENV/bin/python launch/make_chat_data.py data/tiny_chat_sharegpt.parquet
"""
import json
import random
import sys

WORDS = ["red", "green", "blue", "cat", "dog", "bird", "tree", "river", "stone", "house", "light", "cloud",
         "model", "token", "layer", "rank", "memory", "train", "shard", "weight"]
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "You are a careful assistant. Keep answers short."]


def arithmetic(rng):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", f"{a} - {b} = {a - b}."


def reverse(rng):
    words = rng.sample(WORDS, rng.randint(2, 5))
    return "Reverse the words: " + " ".join(words), " ".join(reversed(words))


def count(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 9))]
    n = len(words)
    return "How many words are in: " + " ".join(words), f"There {'is' if n == 1 else 'are'} {n} word{'' if n == 1 else 's'}."


def capitals(rng):
    words = rng.sample(WORDS, rng.randint(1, 4))
    return "Write in capitals: " + " ".join(words), " ".join(words).upper()


TASKS = [arithmetic, reverse, count, capitals]


def chat(rng):
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
    for _ in range(rng.choice([1, 1, 2])):
        question, answer = rng.choice(TASKS)(rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return {"messages": messages}


def main():
    args = sys.argv[1:]
    chats = 3000
    if "--chats" in args:
        i = args.index("--chats")
        chats = int(args[i + 1])
        del args[i:i + 2]
    out = args[0] if args else "data/tiny_chat.jsonl"
    rng = random.Random(20261123)
    records = [chat(rng) for _ in range(chats)]
    if out.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
        speaker = {"system": "system", "user": "human", "assistant": "gpt"}
        turns = [[{"from": speaker[m["role"]], "value": m["content"]} for m in r["messages"]] for r in records]
        pq.write_table(pa.table({"conversations": turns}), out)
    else:
        with open(out, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    print(f"wrote {chats} chats to {out}")


if __name__ == "__main__":
    main()
