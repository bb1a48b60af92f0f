#!/usr/bin/env python3
"""Puts gpu-check's results side by side: scripts/gpu-check.sh OUT_DIR writes
OUT_DIR/summary.json from gpu_check.json, hf_baseline.json and handoff.json
(whichever exist), with the ratios the issue asks for."""
import json
import os
import sys


def load(directory, name):
    path = os.path.join(directory, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    directory = sys.argv[1]
    ours = load(directory, "gpu_check.json")
    hf = load(directory, "hf_baseline.json")
    handoff = load(directory, "handoff.json")
    summary = {"gpu_check": ours is not None, "hf_baseline": hf is not None,
               "handoff": handoff is not None}
    if ours:
        summary["checks_pass"] = ours.get("checks_pass")
        summary["copy_bandwidth_GBps"] = ours.get("copy_bandwidth_bytes_per_second", 0) / 1e9
        rows = []
        hf_by_batch = {g["batch"]: g for g in (hf or {}).get("generate", [])}
        for d in ours.get("decode", []):
            if "error" in d:
                rows.append(d)
                continue
            row = {
                "batch": d["batch"],
                "sluice_decode_tokens_per_s": d["decode_tokens_per_second"],
                "sluice_total_tokens_per_s": d["total_tokens_per_second"],
                "roofline_decode_tokens_per_s": d["roofline_decode_tokens_per_second"],
                "fraction_of_roofline": d["fraction_of_roofline"],
            }
            row["cuda_graphs"] = d.get("cuda_graphs")
            if d.get("graph_error"):
                row["graph_error"] = d["graph_error"]
            eager = [e for e in ours.get("decode_eager", []) if e.get("batch") == d["batch"]]
            if eager and "error" not in eager[0]:
                row["eager_decode_tokens_per_s"] = eager[0]["decode_tokens_per_second"]
                row["eager_fraction_of_roofline"] = eager[0]["fraction_of_roofline"]
                row["graphs_over_eager"] = (
                    d["decode_tokens_per_second"] / eager[0]["decode_tokens_per_second"])
            h = hf_by_batch.get(d["batch"])
            if h:
                row["transformers_total_tokens_per_s"] = h["total_tokens_per_second"]
                row["sluice_over_transformers"] = (
                    d["total_tokens_per_second"] / h["total_tokens_per_second"])
            rows.append(row)
        summary["decode"] = rows
        if "train" in ours:
            summary["train"] = {"sluice_tokens_per_s": ours["train"]["tokens_per_second"]}
            if hf and "train" in hf:
                summary["train"]["pytorch_eager_tokens_per_s"] = hf["train"]["tokens_per_second"]
                summary["train"]["sluice_over_pytorch_eager"] = (
                    ours["train"]["tokens_per_second"] / hf["train"]["tokens_per_second"])
    if handoff:
        summary["handoff_summary"] = handoff
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
