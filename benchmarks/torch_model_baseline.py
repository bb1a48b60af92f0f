#!/usr/bin/python3
"""bench_model's baseline: the same Qwen2 / Llama forward in Python PyTorch.

Loads a Hugging Face model directory written by Sluice (config.json and a
single F32 model.safetensors; the safetensors header is parsed here, since
Debian has no python3-safetensors) and runs, with Debian's python3-torch (the
same LibTorch 1.13.1 as the C++ side):

  forward: one full causal forward of --batch sequences of --seq tokens;
  decode:  --decode-steps incremental steps of --batch rows with a KV cache.

Prints one JSON object: tokens/s of each, and the logits of the first
sequence's last position (so the caller can check both sides computed the
same function). Usage:

  torch_model_baseline.py --model DIR --batch B --seq T --decode-steps N
                          --threads K --repeats R --ids-seed S
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise SystemExit(f"{name}: only F32 is supported by the baseline")
        start, end = info["data_offsets"]
        array = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=base + start)
        tensors[name] = torch.from_numpy(array.copy()).reshape(info["shape"])
    return tensors


class Model:
    def __init__(self, config, weights):
        self.c = config
        self.w = weights
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps = config.get("rms_norm_eps", 1e-6)
        theta = config.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2).double() / self.head_dim))
        self.lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])

    def rms(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, x, positions):
        # x: [B, H, T, D]; positions: [T]
        freqs = positions.double()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().float(), emb.sin().float()
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def proj(self, x, prefix):
        y = x @ self.w[prefix + ".weight"].t()
        bias = self.w.get(prefix + ".bias")
        return y + bias if bias is not None else y

    def forward(self, ids, cache=None, start=0):
        b, t = ids.shape
        x = self.w["model.embed_tokens.weight"][ids]
        positions = torch.arange(start, start + t)
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.rms(x, self.w[p + "input_layernorm.weight"])
            q = self.proj(h, p + "self_attn.q_proj").view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = self.proj(h, p + "self_attn.k_proj").view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.proj(h, p + "self_attn.v_proj").view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            if cache is not None:
                if i in cache:
                    k = torch.cat([cache[i][0], k], dim=2)
                    v = torch.cat([cache[i][1], v], dim=2)
                cache[i] = (k, v)
            group = self.heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            s = k.shape[2]
            mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t)
            scores = scores.masked_fill(~mask, float("-inf"))
            attn = torch.softmax(scores, dim=-1) @ v
            attn = attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
            x = x + self.proj(attn, p + "self_attn.o_proj")
            h = self.rms(x, self.w[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.silu(self.proj(h, p + "mlp.gate_proj"))
            x = x + self.proj(gate * self.proj(h, p + "mlp.up_proj"), p + "mlp.down_proj")
        x = self.rms(x, self.w["model.norm.weight"])
        return x @ self.lm_head.t()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ids", default="", help="comma-separated ids of sequence 0 (else seeded)")
    parser.add_argument("--ids-seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_seconds = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        config = json.load(open(os.path.join(args.model, "config.json")))
        model = Model(config, load_safetensors(os.path.join(args.model, "model.safetensors")))
        load_seconds = min(load_seconds, time.perf_counter() - start)
    gen = torch.Generator().manual_seed(args.ids_seed)
    ids = torch.randint(0, config["vocab_size"], (args.batch, args.seq), generator=gen)
    if args.ids:
        first = torch.tensor([int(x) for x in args.ids.split(",")])
        ids[0, : len(first)] = first[: args.seq]
    with torch.no_grad():
        logits = model.forward(ids)  # warm-up, and the checked logits
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            model.forward(ids)
            best = min(best, time.perf_counter() - start)
        forward_tps = args.batch * args.seq / best
        best_decode = float("inf")
        for _ in range(args.repeats):
            cache = {}
            model.forward(ids, cache=cache)
            token = ids[:, -1:]
            start = time.perf_counter()
            for step in range(args.decode_steps):
                out = model.forward(token, cache=cache, start=args.seq + step)
                token = out[:, -1:].argmax(-1)
            best_decode = min(best_decode, time.perf_counter() - start)
        decode_tps = args.batch * args.decode_steps / best_decode
    print(json.dumps({
        "torch": torch.__version__,
        "threads": args.threads,
        "forward_tokens_per_s": forward_tps,
        "decode_tokens_per_s": decode_tps,
        "load_seconds": load_seconds,
        "last_logits_seq0": logits[0, -1].tolist(),
    }))


if __name__ == "__main__":
    sys.exit(main())
