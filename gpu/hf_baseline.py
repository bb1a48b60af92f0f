#!/usr/bin/env python3
"""The baselines gpu_check is compared with, on the same GPU in the same run.

- Hugging Face transformers `generate` on a Qwen2.5-0.5B-shaped model (random
  weights, bfloat16), at the batch sizes, prompt and new-token lengths that
  gpu_check's decode measurement uses; every sequence runs to its length
  (min_new_tokens = max_new_tokens), sampling at temperature 1.
- PyTorch eager doing the trainer's decoupled-PPO step: the same model in
  float32 master weights under bfloat16 autocast, token log-probs in float32,
  the clipped objective, backward, gradient clipping, AdamW.

Writes one JSON file (--out). Needs torch and transformers; no network.
"""
import argparse
import json
import sys
import time

import torch


def qwen05b_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )


def build(dtype):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(7)
    model = Qwen2ForCausalLM(qwen05b_config()).to(device="cuda", dtype=dtype)
    model.generation_config.pad_token_id = 0
    return model


def sync_time(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def measure_generate(model, batch, prompt, new_tokens):
    generator = torch.Generator().manual_seed(31)
    ids = torch.randint(0, 151936, (batch, prompt), generator=generator).cuda()
    mask = torch.ones_like(ids)
    kwargs = dict(
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
    )
    with torch.inference_mode():
        # Warm-up (kernels, allocator) on one short sequence.
        model.generate(input_ids=ids[:1], attention_mask=mask[:1], do_sample=True,
                       max_new_tokens=8, min_new_tokens=8, top_k=0)
        seconds, out = sync_time(lambda: model.generate(input_ids=ids, **kwargs))
    generated = out.shape[1] - prompt
    return {
        "batch": batch,
        "prompt_tokens": prompt,
        "new_tokens": generated,
        "total_seconds": seconds,
        "total_tokens_per_second": batch * generated / seconds,
    }


def ppo_step(model, optimizer, inputs, targets, mask, advantages):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=inputs).logits
    logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    prox = logp.detach()
    behav = logp.detach() - 0.01
    ratio = torch.exp(logp - prox)
    weight = torch.exp(prox - behav).clamp(max=5.0)
    per_token = -weight * torch.minimum(ratio * advantages,
                                        ratio.clamp(0.8, 1.2) * advantages)
    loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def measure_train(rows, prompt, completion):
    model = build(torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(21)
    ids = torch.randint(0, 151936, (rows, prompt + completion), generator=generator).cuda()
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = torch.zeros(rows, prompt + completion - 1, device="cuda")
    mask[:, prompt - 1:] = 1
    advantages = (torch.randint(0, 2, (rows, 1), generator=generator).float() * 2 - 1).cuda()
    ppo_step(model, optimizer, inputs, targets, mask, advantages)
    steps = 3
    seconds, _ = sync_time(lambda: [ppo_step(model, optimizer, inputs, targets, mask, advantages)
                                    for _ in range(steps)])
    tokens = rows * (prompt + completion - 1) * steps
    return {
        "rows": rows,
        "sequence_tokens": prompt + completion,
        "steps": steps,
        "seconds_per_step": seconds / steps,
        "tokens_per_second": tokens / seconds,
        "attention": model.config._attn_implementation,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="hf_baseline.json")
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--train-rows", type=int, default=16)
    args = parser.parse_args()
    import transformers

    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "device": torch.cuda.get_device_name(0), "generate": []}
    model = build(torch.bfloat16)
    model.eval()
    result["attention"] = model.config._attn_implementation
    for batch in [int(b) for b in args.batches.split(",")]:
        entry = measure_generate(model, batch, args.prompt_tokens, args.new_tokens)
        print(f"[hf_baseline] generate batch {batch}: "
              f"{entry['total_tokens_per_second']:.0f} tokens/s", file=sys.stderr, flush=True)
        result["generate"].append(entry)
    del model
    torch.cuda.empty_cache()
    result["train"] = measure_train(args.train_rows, args.prompt_tokens, args.new_tokens)
    print(f"[hf_baseline] train: {result['train']['tokens_per_second']:.0f} tokens/s",
          file=sys.stderr, flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
