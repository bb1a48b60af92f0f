"""Checks shared by the report tests: the files `sluice report` writes exist,
parse, and hold the series of the run they were made from."""

import json
import math
import os
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
FIGURES = ("reward", "eval", "staleness", "throughput", "optimizer")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"


def run_report(*args, env=None):
    """Runs `python3 -m sluice.report ARGS` as `sluice report` will; returns
    (exit status, stdout, stderr)."""
    process = subprocess.run([PYTHON, "-m", "sluice.report", *args], capture_output=True,
                             text=True, env=env or os.environ.copy(), timeout=300)
    return process.returncode, process.stdout, process.stderr


def read_metrics(run_dir):
    """metrics.jsonl's whole lines (a torn last one, without newline, is not one)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as handle:
        return [json.loads(line) for line in handle if line.strip() and line.endswith("\n")]


def png_size(path):
    """(width, height) from the IHDR chunk; asserts the PNG signature."""
    with open(path, "rb") as handle:
        head = handle.read(33)
    assert head[:8] == PNG_SIGNATURE, "%s: not a PNG" % path
    assert head[12:16] == b"IHDR", "%s: no IHDR chunk first" % path
    return struct.unpack(">II", head[16:24])


def svg_groups(path):
    """{id: element} of every element with an id in the SVG (parses it)."""
    root = ElementTree.parse(path).getroot()
    assert root.tag == SVG_NS + "svg", "%s: root is %s" % (path, root.tag)
    return {element.get("id"): element for element in root.iter() if element.get("id")}


def check_report(test, run_dir, out_dir, formats=("png", "svg")):
    """Asserts everything about one report directory; returns report.json."""
    metrics = read_metrics(run_dir)
    steps = [m["step"] for m in metrics]
    with open(os.path.join(out_dir, "report.json")) as handle:
        report = json.load(handle)
    test.assertEqual(report["steps"], len(metrics))
    test.assertEqual(sorted(report["figures"]), sorted(FIGURES))
    images = []
    for name in FIGURES:
        figure = report["figures"][name]
        test.assertEqual(sorted(figure["files"]), sorted(formats), name)
        for fmt in ("png", "svg"):
            path = os.path.join(out_dir, "%s.%s" % (name, fmt))
            test.assertEqual(os.path.exists(path), fmt in formats, path)
        if "png" in formats:
            path = os.path.join(out_dir, name + ".png")
            width, height = png_size(path)
            test.assertGreaterEqual(width, 600, path)
            test.assertGreaterEqual(height, 300, path)
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.image

            pixels = matplotlib.image.imread(path)
            test.assertEqual(pixels.shape[:2], (height, width))
            # Not a blank canvas: a plot has many distinct colours.
            test.assertGreater(len({tuple(p) for p in pixels[::7, ::7].reshape(-1, pixels.shape[2])
                                    .round(2).tolist()}), 20, path)
            images.append(name + ".png")
        if "svg" in formats:
            path = os.path.join(out_dir, name + ".svg")
            groups = svg_groups(path)
            for gid in figure["series"]:
                if gid.startswith("series-staleness-histogram_total"):
                    test.assertIn(gid + "-0", groups, "%s: bar %s-0" % (path, gid))
                    continue
                test.assertIn(gid, groups, "%s: series %s" % (path, gid))
                # The series' group holds what was drawn: a path or a use of one.
                drawn = [e for e in groups[gid].iter()
                         if e.tag in (SVG_NS + "path", SVG_NS + "use")]
                if any(y is not None for y in figure["series"][gid]["y"]):
                    test.assertTrue(drawn, "%s: series %s has nothing drawn" % (path, gid))
            images.append(name + ".svg")

    series = {gid: s for f in report["figures"].values() for gid, s in f["series"].items()}

    def values(gid):
        return series[gid]["x"], series[gid]["y"]

    # Per-step series carry the run's own numbers, step for step.
    for gid, field in (("series-reward-reward_mean", "reward_mean"),
                       ("series-reward-pass_rate", "pass_rate"),
                       ("series-staleness-staleness_mean", "staleness_mean"),
                       ("series-staleness-staleness_max", "staleness_max"),
                       ("series-throughput-rollout_tokens_per_second",
                        "rollout_tokens_per_second")):
        x, y = values(gid)
        test.assertEqual(x, steps, gid)
        for got, metric in zip(y, metrics):
            test.assertAlmostEqual(got, metric[field], places=9, msg=gid)
    # Optimizer and trainer-throughput series leave out steps that trained nothing.
    trained = [m for m in metrics if m["tokens_trained"] > 0 and not m.get("update_skipped")]
    for gid, field in (("series-optimizer-loss", "loss"),
                       ("series-optimizer-kl_to_behaviour", "kl_to_behaviour"),
                       ("series-optimizer-entropy", "entropy"),
                       ("series-optimizer-clip_fraction", "clip_fraction"),
                       ("series-throughput-trainer_tokens_per_second",
                        "trainer_tokens_per_second")):
        x, y = values(gid)
        test.assertEqual(x, [m["step"] for m in trained], gid)
        for got, metric in zip(y, trained):
            test.assertAlmostEqual(got, metric[field], places=9, msg=gid)
    # The staleness histogram per step and over the run add up to the groups trained.
    width = max(len(m["staleness_histogram"]) for m in metrics)
    for s in range(width):
        x, y = values("series-staleness-histogram_%d" % s)
        test.assertEqual(x, steps)
        test.assertEqual(y, [float(m["staleness_histogram"][s])
                             if s < len(m["staleness_histogram"]) else 0.0 for m in metrics])
    _, totals = values("series-staleness-histogram_total")
    test.assertEqual(sum(totals), sum(sum(m["staleness_histogram"]) for m in metrics))
    # Held-out evals: every non-warm-start line of evals.jsonl, in order.
    with open(os.path.join(run_dir, "evals.jsonl")) as handle:
        evals = [json.loads(line) for line in handle if line.strip()]
    held_out = [e for e in evals if e["phase"] != "warm_start"]
    x, y = values("series-eval-held_out_accuracy")
    test.assertEqual(x, [e["step"] for e in held_out])
    test.assertEqual(y, [e["accuracy"] for e in held_out])
    test.assertTrue(any(e["phase"] == "before" for e in held_out))
    test.assertTrue(any(e["phase"] == "after" for e in held_out))

    # index.html references every image, each file exists, and shows the summary.
    with open(os.path.join(out_dir, "index.html"), encoding="utf-8") as handle:
        page = handle.read()
    referenced = set(re.findall(r'(?:src|href)="([^"]+)"', page))
    shown = "svg" if "svg" in formats else "png"
    for name in FIGURES:
        test.assertIn("%s.%s" % (name, shown), referenced)
        for fmt in formats:
            test.assertIn("%s.%s" % (name, fmt), referenced)
    for target in referenced:
        if not target.startswith("#"):
            test.assertTrue(os.path.exists(os.path.join(out_dir, target)), target)
    test.assertNotIn("http://", page.replace("http://www.w3.org", ""))
    test.assertNotIn("https://", page)
    with open(os.path.join(run_dir, "summary.json")) as handle:
        summary = json.load(handle)
    test.assertIn(summary["run_id"], page)
    test.assertIn(summary["state"], page)
    test.assertIn("eval accuracy before", page)
    return report


def finite(values):
    return [v for v in values if v is not None and not math.isnan(v)]
