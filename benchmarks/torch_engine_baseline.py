#!/usr/bin/python3
"""bench_engine's baseline: rollout generation as a straightforward Python
PyTorch program does it, on the same weights and the same workload.

Reads the workload bench_engine wrote (--workload FILE: the prompts, the group
size G, each sequence's completion length, the batch size in rows, the
temperature and seed) and generates every sequence the plain way: static
batches of --rows sequences in order (G samples of a prompt each prefill the
prompt), a KV cache, temperature sampling with torch.multinomial, each batch
decoded until its longest sequence has its length (the shorter ones are
decoded on and their extra tokens thrown away). Uses the model of
torch_model_baseline.py (the same forward as bench_model's baseline) with
Debian's python3-torch, the same LibTorch 1.13.1 as the C++ side.

Prints one JSON object: useful tokens (the sum of the sequences' lengths),
decoded row-steps, seconds, useful tokens/s.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model_baseline import Model, load_safetensors  # noqa: E402


def generate(model, workload, gen):
    prompts = workload["prompts"]
    group = workload["group_size"]
    lengths = workload["lengths"]
    rows = workload["rows"]
    temperature = workload["temperature"]
    useful = 0
    row_steps = 0
    for first in range(0, len(lengths), rows):
        batch = list(range(first, min(first + rows, len(lengths))))
        ids = torch.tensor([prompts[i // group] for i in batch], dtype=torch.int64)
        steps = max(lengths[i] for i in batch)
        cache = {}
        logits = model.forward(ids, cache=cache)[:, -1]
        position = ids.shape[1]
        for step in range(steps):
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=gen)
            row_steps += len(batch)
            if step + 1 == steps:
                break
            logits = model.forward(token, cache=cache, start=position)[:, -1]
            position += 1
        useful += sum(lengths[i] for i in batch)
    return useful, row_steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = json.load(open(os.path.join(args.model, "config.json")))
    model = Model(config, load_safetensors(os.path.join(args.model, "model.safetensors")))
    workload = json.load(open(args.workload))
    gen = torch.Generator().manual_seed(workload["seed"])
    best = float("inf")
    with torch.no_grad():
        for _ in range(args.repeats):
            start = time.perf_counter()
            useful, row_steps = generate(model, workload, gen)
            best = min(best, time.perf_counter() - start)
    print(json.dumps({
        "torch": torch.__version__,
        "threads": args.threads,
        "useful_tokens": useful,
        "decoded_row_steps": row_steps,
        "seconds": best,
        "tokens_per_s": useful / best,
    }))


if __name__ == "__main__":
    sys.exit(main())
