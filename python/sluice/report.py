"""Plots of one run from its files: `sluice report RUN_DIR`.

    python3 -m sluice.report RUN_DIR [--out DIR] [--format png|svg|both]

Reads what the controller writes to <runs-dir>/<run-id>/ (docs/runs.md):
metrics.jsonl (one TrainingStepMetrics per RL step), evals.jsonl (one
EvalResult per evaluation), summary.json (RunSummary) and spec.json (the
resolved RunSpec), and writes to --out (default RUN_DIR/report/):

  reward.{png,svg}      reward mean and pass rate per step (with a moving mean)
  eval.{png,svg}        held-out accuracy before/during/after RL, warm-start dev accuracy
  staleness.{png,svg}   staleness mean/max per step against eta, groups per
                        staleness value per step, and over the whole run
  throughput.{png,svg}  rollout and trainer tokens/s per step
  optimizer.{png,svg}   loss, KL to the behaviour policy, entropy, clip fraction
  index.html            the figures and the run's summary, one self-contained page
  report.json           the data of every plotted series (what the tests check)

Plotted with matplotlib's Agg backend: no display needed. Every plotted line
carries a gid ("series-<figure>-<name>"), which the SVG writes as the id of
its <g> element.

A run still in progress can be reported on: a torn last line of a .jsonl file
(being written) is skipped with a warning. Bad input (no such directory, no
metrics.jsonl, no steps, a malformed line elsewhere) is an error with exit
status 2; a missing matplotlib is exit status 1.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

EXIT_BAD_INPUT = 2


class ReportError(Exception):
    """Input that cannot be reported on; the message says what and where."""


class MissingDependency(Exception):
    """The plotting library is not installed."""


def _warn(message: str) -> None:
    print("sluice report: warning: %s" % message, file=sys.stderr)


# ---------------------------------------------------------------------------
# Reading the run's files
# ---------------------------------------------------------------------------

def read_jsonl(path: str, required: bool) -> List[Dict[str, Any]]:
    """The objects of a JSON Lines file, one per non-empty line.

    A last line that does not parse and has no newline is a torn write (the
    run is still going, or died mid-line): skipped with a warning. Any other
    bad line is a ReportError naming it. A missing file is a ReportError when
    `required`, else [].
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        if required:
            raise ReportError("%s: not found (is this a run directory? it should hold "
                              "metrics.jsonl, evals.jsonl, summary.json, spec.json)" % path)
        return []
    except OSError as error:
        raise ReportError("%s: cannot read: %s" % (path, error.strerror or error))
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    records = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        is_last = number == len(lines)
        try:
            record = json.loads(raw.decode("utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as error:
            if is_last and torn_tail:
                _warn("%s:%d: skipping a torn last line (%d bytes; the run may still be "
                      "writing it)" % (path, number, len(raw)))
                continue
            raise ReportError("%s:%d: not a JSON object: %s" % (path, number, error))
        records.append(record)
    return records


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """A JSON object file, or None when absent (warned) or unreadable (warned)."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        _warn("%s: ignored, cannot be read as JSON: %s" % (path, error))
        return None
    if not isinstance(value, dict):
        _warn("%s: ignored, not a JSON object" % path)
        return None
    return value


class RunFiles:
    """The files of one run directory, read and checked."""

    def __init__(self, run_dir: str):
        if not os.path.exists(run_dir):
            raise ReportError("%s: no such directory" % run_dir)
        if not os.path.isdir(run_dir):
            raise ReportError("%s: not a directory (give a run's directory, "
                              "<runs-dir>/<run-id>/)" % run_dir)
        self.run_dir = run_dir
        self.steps = read_jsonl(os.path.join(run_dir, "metrics.jsonl"), required=True)
        if not self.steps:
            raise ReportError("%s: no training steps in metrics.jsonl (the run has not "
                              "trained yet, or failed before its first step)"
                              % os.path.join(run_dir, "metrics.jsonl"))
        for index, step in enumerate(self.steps):
            if not isinstance(step.get("step"), (int, float)):
                raise ReportError("%s: line %d has no \"step\" number"
                                  % (os.path.join(run_dir, "metrics.jsonl"), index + 1))
        self.steps.sort(key=lambda record: record["step"])
        self.evals = read_jsonl(os.path.join(run_dir, "evals.jsonl"), required=False)
        self.summary = read_json(os.path.join(run_dir, "summary.json"))
        self.spec = read_json(os.path.join(run_dir, "spec.json"))
        if self.summary is None:
            _warn("%s: no summary.json (the run may still be going); the summary table "
                  "is left out" % run_dir)
        if not self.evals and self.summary and self.summary.get("evals"):
            self.evals = [e for e in self.summary["evals"] if isinstance(e, dict)]

    def column(self, name: str, trained_only: bool = False) -> List[float]:
        """metrics.jsonl's `name` per step; a missing value is NaN (a gap).

        trained_only: NaN for steps that trained no token (every group of the
        batch had equal rewards, or the update was skipped), whose loss,
        entropy, KL and trainer throughput are reported as 0 but mean nothing.
        """
        values = []
        for step in self.steps:
            value = step.get(name)
            if trained_only and not self.trained(step):
                values.append(math.nan)
                continue
            values.append(float(value) if isinstance(value, (int, float))
                          and not isinstance(value, bool) else math.nan)
        return values

    @staticmethod
    def trained(step: Dict[str, Any]) -> bool:
        if step.get("update_skipped") is True:
            return False
        tokens = step.get("tokens_trained")
        return not isinstance(tokens, (int, float)) or tokens > 0

    @property
    def step_numbers(self) -> List[int]:
        return [int(step["step"]) for step in self.steps]

    @property
    def eta(self) -> Optional[int]:
        if self.summary and isinstance(self.summary.get("eta"), (int, float)):
            return int(self.summary["eta"])
        algorithm = (self.spec or {}).get("algorithm") or {}
        value = algorithm.get("max_staleness")
        return int(value) if isinstance(value, (int, float)) else None

    @property
    def run_id(self) -> str:
        if self.summary and self.summary.get("run_id"):
            return str(self.summary["run_id"])
        return os.path.basename(os.path.normpath(self.run_dir))

    @property
    def name(self) -> str:
        return str((self.spec or {}).get("name") or "")


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

def moving_mean(values: Sequence[float], window: int) -> List[float]:
    """Trailing mean over `window` values, ignoring NaN."""
    out = []
    for index in range(len(values)):
        chunk = [v for v in values[max(0, index - window + 1): index + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else math.nan)
    return out


def _smoothing_window(count: int) -> int:
    return max(1, min(50, count // 10))


class Figures:
    """Builds the figures with matplotlib and records each series' data."""

    def __init__(self, run: RunFiles):
        try:
            import matplotlib
        except ImportError as error:
            raise MissingDependency(
                "matplotlib is not installed for %s (%s); on Debian: apt-get install "
                "python3-matplotlib (scripts/install-deps.sh installs it)"
                % (sys.executable, error)) from None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt = plt
        self.run = run
        # name -> {"title", "caption", "series": {gid: {"label", "x", "y"}}, "figure"}
        self.figures: Dict[str, Dict[str, Any]] = {}
        plt.rcParams.update({
            "figure.dpi": 100,
            "savefig.dpi": 110,
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.titleweight": "bold",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "legend.frameon": False,
            "legend.fontsize": 9,
            # Reproducible SVGs: fixed ids, no date.
            "svg.hashsalt": "sluice-report",
            "svg.fonttype": "path",
        })

    def _new(self, name: str, title: str, caption: str, rows: int = 1, cols: int = 1,
             size: Tuple[float, float] = (9.0, 4.2), sharex: bool = True):
        figure, axes = self.plt.subplots(rows, cols, figsize=size, sharex=sharex, squeeze=False)
        figure.suptitle("%s — %s" % (title, self._label()), fontsize=12)
        self.figures[name] = {"title": title, "caption": caption, "series": {},
                              "figure": figure}
        return figure, axes

    def _label(self) -> str:
        return "%s (%s)" % (self.run.name, self.run.run_id) if self.run.name else self.run.run_id

    def _line(self, figure_name: str, axes, key: str, x: Sequence[float], y: Sequence[float],
              label: str, skip_gaps: bool = False, **style):
        """Plots one series with a gid; skip_gaps joins the points around NaNs
        (steps that trained nothing) instead of breaking the line there."""
        gid = "series-%s-%s" % (figure_name, key)
        if skip_gaps:
            kept = [(a, b) for a, b in zip(x, y) if not math.isnan(b)]
            x, y = [a for a, _ in kept], [b for _, b in kept]
        (line,) = axes.plot(x, y, label=label, **style)
        line.set_gid(gid)
        self.figures[figure_name]["series"][gid] = {
            "label": label, "x": [_json_number(v) for v in x], "y": [_json_number(v) for v in y]}
        return line

    def _record(self, figure_name: str, artist, key: str, label: str, x, y) -> None:
        gid = "series-%s-%s" % (figure_name, key)
        if hasattr(artist, "patches"):  # a BarContainer: one <g> per bar
            for index, patch in enumerate(artist.patches):
                patch.set_gid("%s-%d" % (gid, index))
        else:
            artist.set_gid(gid)
        self.figures[figure_name]["series"][gid] = {
            "label": label, "x": [_json_number(v) for v in x], "y": [_json_number(v) for v in y]}

    def build(self) -> None:
        self.reward()
        self.evals()
        self.staleness()
        self.throughput()
        self.optimizer()

    def reward(self) -> None:
        steps = self.run.step_numbers
        window = _smoothing_window(len(steps))
        _, axes = self._new("reward", "Reward and pass rate",
                            "Mean training reward and fraction of trajectories with reward >= 1 "
                            "per RL step (faint), with a trailing mean over %d steps." % window)
        ax = axes[0][0]
        reward = self.run.column("reward_mean")
        pass_rate = self.run.column("pass_rate")
        self._line("reward", ax, "reward_mean", steps, reward, "reward mean (per step)",
                   color="C0", alpha=0.3, linewidth=1)
        self._line("reward", ax, "pass_rate", steps, pass_rate, "pass rate (per step)",
                   color="C1", alpha=0.3, linewidth=1)
        self._line("reward", ax, "reward_mean_smoothed", steps, moving_mean(reward, window),
                   "reward mean (mean of %d)" % window, color="C0", linewidth=2)
        self._line("reward", ax, "pass_rate_smoothed", steps, moving_mean(pass_rate, window),
                   "pass rate (mean of %d)" % window, color="C1", linewidth=2,
                   linestyle=(0, (4, 2)))  # dashed: with 0/1 rewards it equals the reward mean
        ax.set_xlabel("RL step")
        ax.set_ylabel("reward / fraction")
        top = max([v for v in reward + pass_rate if not math.isnan(v)] + [1.0])
        ax.set_ylim(-0.02, top * 1.05)
        ax.legend(loc="best", ncol=2)

    def evals(self) -> None:
        evals = self.run.evals
        held_out = [e for e in evals if e.get("phase") != "warm_start"]
        warm = [e for e in evals if e.get("phase") == "warm_start"]
        cols = 2 if warm else 1
        size = (11.0, 4.2) if warm else (9.0, 4.2)
        caption = ("Greedy accuracy on the held-out split before RL, every eval.every_n_steps "
                   "and at the end")
        caption += ("" if not warm else " (left); the warm start's accuracy on its dev split "
                    "per SFT step (right)") + "."
        _, axes = self._new("eval", "Evaluation accuracy", caption, cols=cols, size=size,
                            sharex=False)
        ax = axes[0][0]
        if held_out:
            x = [float(e.get("step", 0)) for e in held_out]
            y = [float(e.get("accuracy", math.nan)) for e in held_out]
            self._line("eval", ax, "held_out_accuracy", x, y, "held-out accuracy",
                       color="C2", marker="o", linewidth=2)
            for step, accuracy, record in zip(x, y, held_out):
                ax.annotate("%.0f%%" % (100 * accuracy), (step, accuracy),
                            textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
            rewards = [float(e.get("reward_mean", math.nan)) for e in held_out]
            self._line("eval", ax, "held_out_reward_mean", x, rewards, "held-out reward mean",
                       color="C2", linestyle="--", alpha=0.6)
            ax.set_ylim(-0.02, 1.05)
        else:
            ax.text(0.5, 0.5, "no held-out evaluation yet", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
        ax.set_title("held-out split, by RL step")
        ax.set_xlabel("RL step (policy version)")
        ax.set_ylabel("accuracy")
        if held_out:
            ax.legend(loc="best")
        if warm:
            ax = axes[0][1]
            x = [float(e.get("step", 0)) for e in warm]
            y = [float(e.get("accuracy", math.nan)) for e in warm]
            self._line("eval", ax, "warm_start_accuracy", x, y, "dev accuracy",
                       color="C4", marker="o", linewidth=2)
            ax.set_title("warm start (SFT), dev split")
            ax.set_xlabel("SFT step")
            ax.set_ylabel("accuracy")
            ax.set_ylim(-0.02, 1.05)
            ax.legend(loc="best")

    def staleness(self) -> None:
        steps = self.run.step_numbers
        eta = self.run.eta
        figure, axes = self._new(
            "staleness", "Staleness",
            "Staleness of a group = trainer version minus the oldest policy version of its "
            "tokens. Top: mean and max over each step's batch, with the bound eta. Bottom left: "
            "groups per staleness value in each step's batch. Bottom right: over the whole run.",
            rows=2, cols=2, size=(11.0, 7.0), sharex=False)
        gs = axes[0][0].get_gridspec()
        for ax in (axes[0][0], axes[0][1]):
            ax.remove()
        top = figure.add_subplot(gs[0, :])
        mean = self.run.column("staleness_mean")
        maximum = self.run.column("staleness_max")
        self._line("staleness", top, "staleness_max", steps, maximum, "max", color="C3",
                   linewidth=3, alpha=0.45, drawstyle="steps-mid")
        self._line("staleness", top, "staleness_mean", steps, mean, "mean", color="C0",
                   linewidth=1.3, drawstyle="steps-mid")
        if eta is not None:
            bound = top.axhline(eta, color="0.3", linestyle=":", linewidth=1.2,
                                label="eta = %d (bound)" % eta)
            self._record("staleness", bound, "eta", "eta", [steps[0], steps[-1]], [eta, eta])
        top.set_xlabel("RL step")
        top.set_ylabel("versions")
        top.legend(loc="best")
        top_value = max([v for v in maximum if not math.isnan(v)] + [eta or 0, 1])
        top.set_ylim(-0.1, top_value + 0.6)
        top.yaxis.get_major_locator().set_params(integer=True)

        histograms = [step.get("staleness_histogram") or [] for step in self.run.steps]
        width = max([len(h) for h in histograms] + [1])
        counts = [[float(h[s]) if s < len(h) else 0.0 for h in histograms] for s in range(width)]
        ax = axes[1][0]
        # Fresh groups cool, stale ones warm.
        colors = self.plt.get_cmap("plasma")(
            [0.12 + 0.7 * i / max(1, width - 1) for i in range(width)])
        stacks = ax.stackplot(steps, counts, labels=["staleness %d" % s for s in range(width)],
                              colors=colors, step="mid")
        for s, (stack, row) in enumerate(zip(stacks, counts)):
            self._record("staleness", stack, "histogram_%d" % s, "staleness %d" % s, steps, row)
        ax.set_xlabel("RL step")
        ax.set_ylabel("groups in batch")
        ax.set_title("per step")
        ax.grid(False)
        ax.set_ylim(0, max([sum(column) for column in zip(*counts)] + [1]) * 1.22)
        ax.legend(loc="upper center", fontsize=8, ncol=min(width, 6), frameon=True,
                  facecolor="white", framealpha=0.9, edgecolor="0.8")

        ax = axes[1][1]
        totals = [sum(row) for row in counts]
        bars = ax.bar(range(width), totals, color=colors)
        self._record("staleness", bars, "histogram_total", "groups", list(range(width)), totals)
        total = sum(totals) or 1
        for s, value in enumerate(totals):
            ax.annotate("%.0f%%" % (100 * value / total), (s, value), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=8)
        ax.set_xticks(range(width))
        ax.set_ylim(0, max(totals + [1]) * 1.12)
        ax.set_xlabel("staleness (versions)")
        ax.set_ylabel("groups trained")
        ax.set_title("whole run")
        figure.tight_layout(rect=(0, 0, 1, 0.96))

    def throughput(self) -> None:
        steps = self.run.step_numbers
        _, axes = self._new("throughput", "Throughput",
                            "Completion tokens generated per second by all rollout workers (over "
                            "the last few seconds, as the controller saw it at each step) and "
                            "token positions trained per second of trainer compute (steps that "
                            "trained no token are left out).",
                            rows=2, size=(9.0, 6.0))
        rollout = self.run.column("rollout_tokens_per_second")
        trainer = self.run.column("trainer_tokens_per_second", trained_only=True)
        ax = axes[0][0]
        self._line("throughput", ax, "rollout_tokens_per_second", steps, rollout,
                   "rollout (generated)", color="C0", linewidth=1.5)
        ax.set_ylabel("tokens/s")
        ax.set_title("rollout workers: completion tokens generated")
        ax = axes[1][0]
        self._line("throughput", ax, "trainer_tokens_per_second", steps, trainer,
                   "trainer (per step)", skip_gaps=True, color="C1", linewidth=1, alpha=0.4,
                   marker=".", markersize=3)
        window = _smoothing_window(len(steps))
        self._line("throughput", ax, "trainer_tokens_per_second_smoothed", steps,
                   moving_mean(trainer, window), "trainer (mean of %d)" % window,
                   skip_gaps=True, color="C1", linewidth=2)
        ax.set_ylabel("tokens/s")
        ax.set_xlabel("RL step")
        ax.set_title("trainer: token positions trained (per second of compute)")
        ax.legend(loc="best")
        for row in axes:
            row[0].set_ylim(bottom=0)

    def optimizer(self) -> None:
        steps = self.run.step_numbers
        _, axes = self._new("optimizer", "Loss, KL, entropy, clip fraction",
                            "Policy loss (mean over trained tokens), KL(behaviour || current) "
                            "(k3 estimator), mean entropy of the current policy (nats) and the "
                            "fraction of tokens whose ratio was clipped, per RL step. Steps that "
                            "trained no token (every group had equal rewards: no advantage) are "
                            "left out.",
                            rows=2, cols=2, size=(11.0, 6.5))
        panels = [
            ("loss", "loss", "C0"),
            ("kl_to_behaviour", "KL to behaviour", "C3"),
            ("entropy", "entropy (nats)", "C2"),
            ("clip_fraction", "clip fraction", "C4"),
        ]
        for (key, label, color), ax in zip(panels, [a for row in axes for a in row]):
            values = self.run.column(key, trained_only=True)
            self._line("optimizer", ax, key, steps, values, label, skip_gaps=True, color=color,
                       linewidth=1.2, marker=".", markersize=5)
            ax.set_title(label)
            ax.set_xlabel("RL step")
            ax.set_xlim(steps[0] - 0.5, steps[-1] + 0.5)
            finite = [v for v in values if not math.isnan(v)]
            if key != "loss" and finite and min(finite) >= 0:
                # Non-negative quantities read best from 0; an all-zero clip
                # fraction gets a visible 0..1 scale rather than +-0.05.
                peak = max(finite)
                ax.set_ylim(0, peak * 1.12 if peak > 0 else 1.0)
            if all(math.isnan(v) for v in values):
                ax.text(0.5, 0.5, "no step trained a token", ha="center", va="center",
                        transform=ax.transAxes, color="0.4")
        for ax in axes[0]:
            ax.tick_params(labelbottom=True)

    def save(self, out_dir: str, formats: Sequence[str]) -> Dict[str, Dict[str, str]]:
        files: Dict[str, Dict[str, str]] = {}
        for name, entry in self.figures.items():
            figure = entry.pop("figure")
            if name != "staleness":
                figure.tight_layout(rect=(0, 0, 1, 0.96))
            files[name] = {}
            for fmt in formats:
                filename = "%s.%s" % (name, fmt)
                figure.savefig(os.path.join(out_dir, filename), format=fmt,
                               metadata={"Date": None} if fmt == "svg" else None)
                files[name][fmt] = filename
            self.plt.close(figure)
            entry["files"] = files[name]
        return files


def _json_number(value: float) -> Optional[float]:
    return None if isinstance(value, float) and (math.isnan(value) or math.isinf(value)) else value


# ---------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1180px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.92em; }
td, th { border-bottom: 1px solid #ddd; padding: 0.25em 0.9em 0.25em 0; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state-RUN_STATE_SUCCEEDED { color: #1a7f37; font-weight: bold; }
.state-RUN_STATE_FAILED { color: #cf222e; font-weight: bold; }
.state-RUN_STATE_CANCELLED { color: #9a6700; font-weight: bold; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
nav a { margin-right: 1em; }
.tables { display: flex; flex-wrap: wrap; gap: 2.5em; }
"""


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "—"
        if abs(value) >= 1000 or value == int(value):
            return "{:,.0f}".format(value) if abs(value) >= 1000 else "%g" % value
        return "%.4g" % value
    if isinstance(value, int):
        return "{:,}".format(value)
    return str(value)


def _seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "—"
    if value < 60:
        return "%.1f s" % value
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return ("%dh %02dm %02ds" % (hours, minutes, seconds) if hours
            else "%dm %02ds" % (minutes, seconds))


def summary_rows(run: RunFiles) -> List[Tuple[str, str]]:
    """(label, value) rows of the run's summary table."""
    s = run.summary or {}
    spec = run.spec or {}
    algorithm = spec.get("algorithm") or {}
    model = spec.get("model") or {}
    rows: List[Tuple[str, str]] = []

    def add(label, value):
        if value is not None and value != "":
            rows.append((label, value if isinstance(value, str) else _format_value(value)))

    add("run", run.run_id)
    add("name", spec.get("name"))
    add("state", s.get("state"))
    if s.get("error_message"):
        add("error", s.get("error_message"))
    add("model", model.get("builtin") or model.get("hf_model_dir"))
    add("objective", algorithm.get("objective"))
    add("group size × batch (groups)", "%s × %s" % (algorithm.get("group_size", "?"),
                                                    algorithm.get("batch_size_groups", "?"))
        if algorithm else None)
    add("eta (max staleness bound)", s.get("eta", algorithm.get("max_staleness")))
    if "eval_before" in s:
        add("eval accuracy before → after", "%.1f%% → %.1f%%"
            % (100 * s.get("eval_before", 0), 100 * s.get("eval_after", 0)))
    add("RL steps", s.get("steps", len(run.steps)))
    add("final reward mean (last 10 steps)", s.get("final_reward_mean"))
    add("max staleness seen", s.get("max_observed_staleness", s.get("max_staleness")))
    add("groups generated / trained / evicted stale",
        "%s / %s / %s" % (_format_value(s["groups_generated"]), _format_value(s["groups_trained"]),
                          _format_value(s.get("groups_evicted_stale", 0)))
        if "groups_generated" in s and "groups_trained" in s else None)
    add("tokens generated", s.get("tokens_generated"))
    add("tokens trained", s.get("tokens_trained"))
    add("weight versions published", s.get("weight_versions"))
    if s.get("warm_start_steps"):
        add("warm start", "%s SFT steps in %s, dev accuracy %.1f%%"
            % (s["warm_start_steps"], _seconds(s.get("warm_start_seconds")),
               100 * s.get("warm_start_accuracy", 0)))
    if "rl_seconds" in s:
        add("RL time", _seconds(s.get("rl_seconds")))
    if "wall_seconds" in s:
        add("wall time (submit → end)", _seconds(s.get("wall_seconds")))
    recovery = s.get("recovery") or {}
    restarts = recovery.get("restarts") or {}
    survived = ["%s %s" % (count, name) for name, count in sorted(restarts.items()) if count]
    for key in ("workers_lost", "prompts_reissued", "trainer_resumes", "controller_readoptions"):
        if recovery.get(key):
            survived.append("%s %s" % (recovery[key], key.replace("_", " ")))
    if recovery:
        add("survived (restarts, losses)", ", ".join(survived) if survived else "nothing")
    return rows


def write_html(path: str, run: RunFiles, figures: Dict[str, Dict[str, Any]],
               formats: Sequence[str]) -> None:
    esc = html.escape
    state = (run.summary or {}).get("state", "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Sluice run report: %s</title>" % esc(run.run_id),
        "<style>%s</style></head><body>" % _STYLE,
        "<h1>%s</h1>" % esc(run.name or run.run_id),
        '<p class="sub">Sluice run <code>%s</code>%s · %d RL steps plotted · from <code>%s</code>'
        "</p>" % (esc(run.run_id),
                  ' · <span class="state-%s">%s</span>' % (esc(state), esc(state))
                  if state else "", len(run.steps), esc(os.path.abspath(run.run_dir))),
        "<nav>%s</nav>" % "".join('<a href="#%s">%s</a>' % (esc(name), esc(entry["title"]))
                                  for name, entry in figures.items()),
        '<div class="tables">',
    ]
    rows = summary_rows(run)
    if run.summary is None:
        parts.append("<p><em>summary.json not found: the run may still be going.</em></p>")
    parts.append("<div><h2>Summary</h2><table>")
    for label, value in rows:
        parts.append("<tr><th>%s</th><td>%s</td></tr>" % (esc(label), esc(value)))
    parts.append("</table></div>")
    if run.evals:
        parts.append("<div><h2>Evaluations</h2><table><tr><th>phase</th><th>step</th>"
                     "<th>prompts</th><th>correct</th><th>accuracy</th><th>reward mean</th></tr>")
        for e in run.evals:
            parts.append(
                '<tr><td>%s</td><td class="num">%s</td><td class="num">%s</td>'
                '<td class="num">%s</td><td class="num">%.1f%%</td><td class="num">%.3f</td></tr>'
                % (esc(str(e.get("phase", ""))), esc(_format_value(e.get("step", ""))),
                   esc(_format_value(e.get("num_prompts", ""))),
                   esc(_format_value(e.get("num_correct", ""))),
                   100 * float(e.get("accuracy", 0) or 0), float(e.get("reward_mean", 0) or 0)))
        parts.append("</table></div>")
    parts.append("</div>")
    shown = "svg" if "svg" in formats else "png"
    for name, entry in figures.items():
        files = entry["files"]
        links = " · ".join('<a href="%s">%s</a>' % (esc(f), fmt.upper())
                           for fmt, f in sorted(files.items()))
        parts.append('<figure id="%s"><h2>%s</h2><img src="%s" alt="%s">'
                     "<figcaption>%s (%s)</figcaption></figure>"
                     % (esc(name), esc(entry["title"]), esc(files[shown]), esc(entry["title"]),
                        esc(entry["caption"]), links))
    parts.append('<p class="sub">Written by <code>sluice report</code> with matplotlib; the '
                 'plotted data is in <a href="report.json">report.json</a>.</p>')
    parts.append("</body></html>")
    _write_atomically(path, "\n".join(parts) + "\n")


def _write_atomically(path: str, text: str) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------

def make_report(run_dir: str, out_dir: Optional[str] = None,
                formats: Sequence[str] = ("png", "svg")) -> Dict[str, Any]:
    """Writes the report of `run_dir` to `out_dir` (default RUN_DIR/report);
    returns what report.json holds. Raises ReportError for bad input."""
    run = RunFiles(run_dir)
    out_dir = out_dir or os.path.join(run_dir, "report")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise ReportError("%s: cannot create the output directory: %s"
                          % (out_dir, error.strerror or error))
    figures = Figures(run)
    figures.build()
    figures.save(out_dir, formats)
    write_html(os.path.join(out_dir, "index.html"), run, figures.figures, formats)
    report = {
        "run_id": run.run_id,
        "name": run.name,
        "run_dir": os.path.abspath(run_dir),
        "steps": len(run.steps),
        "formats": list(formats),
        "summary": dict(summary_rows(run)),
        "figures": {name: {"title": entry["title"], "files": entry["files"],
                           "series": entry["series"]}
                    for name, entry in figures.figures.items()},
    }
    _write_atomically(os.path.join(out_dir, "report.json"), json.dumps(report, indent=1) + "\n")
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice report",
        description="Plot a run from its files (metrics.jsonl, evals.jsonl, summary.json, "
                    "spec.json): reward and pass rate, eval accuracy, staleness, throughput, "
                    "loss/KL/entropy/clip fraction, as PNG and/or SVG with an index.html.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory, "
                        "<runs-dir>/<run-id>/")
    parser.add_argument("--out", metavar="DIR", help="where to write (default RUN_DIR/report/)")
    parser.add_argument("--format", choices=("png", "svg", "both"), default="both",
                        help="image format (default both; index.html shows SVG when written)")
    args = parser.parse_args(argv)
    formats = ("png", "svg") if args.format == "both" else (args.format,)
    try:
        report = make_report(args.run_dir, args.out, formats)
    except ReportError as error:
        print("sluice report: error: %s" % error, file=sys.stderr)
        return EXIT_BAD_INPUT
    except MissingDependency as error:
        print("sluice report: error: %s" % error, file=sys.stderr)
        return 1
    out_dir = args.out or os.path.join(args.run_dir, "report")
    print("sluice report: %d steps of %s -> %s" % (
        report["steps"], report["run_id"], os.path.join(out_dir, "index.html")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
