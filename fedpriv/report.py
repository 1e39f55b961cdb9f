"""Reports from run directories: ``python -m fedpriv.report PATH``.

* ``PATH`` is a run (it holds ``summary.json``): writes ``PATH/curves.png`` — test accuracy and
  test loss against the round, and the epsilon spent so far (a non-private run says so instead).
* ``PATH`` holds runs (a Hydra multirun directory: ``PATH/0``, ``PATH/1``, …, at any depth):
  writes ``PATH/sweep.csv`` — one row per run: the config values that differ between the runs
  (the swept ones), final accuracy, loss, whether the run degraded and its likely cause (the run's
  end-of-run check, :mod:`fedpriv.degradation`), the unigram baseline, epsilon, delta, rounds, wall
  time — and ``PATH/sweep.png``: final accuracy against epsilon, one line per combination of the
  swept values other than the privacy budget (e.g. one per mechanism), degraded runs marked, and
  the unigram baseline drawn where the data has one.

Everything is read from the files the runs wrote (``config.yaml``, ``metrics.jsonl``,
``summary.json``) — never ``diagnostics.jsonl``, which the epsilon does not cover — and nothing
is recomputed. Every plot names the runs' randomness mode; a non-private run is plotted as such,
never at a finite epsilon. Bad input or a damaged file: one line on stderr naming it, exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


from fedpriv.release.atomic import write_atomic
from fedpriv.errors import ConfigError, OutputError
from fedpriv.keys.randomness import PAIRED, PAIRED_NOTE, SECURE, mode_label
from fedpriv.release.rundir import RunDirectory, read_mapping

BUDGET_KEYS = ("privacy.target_epsilon", "privacy.noise_multiplier")  # the x axis, not a line
IGNORED_KEYS = ("run_dir",)


def _flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(cfg, dict):
        out: dict[str, Any] = {}
        for k, v in cfg.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: cfg}


def _read_json(path: Path) -> dict:
    return read_mapping(path, json.loads)


def _mode_label(modes: Iterable[str]) -> str:
    """The randomness mode of the runs behind a plot (research runs are not for release)."""
    modes = set(modes)
    if modes == {SECURE}:
        return "secure mode"
    if PAIRED in modes:
        return f"research mode, some runs {PAIRED_NOTE}"
    return "research mode: randomness reproducible from the seed, not for release"


def _as_float(value: Any) -> float:
    """JSON numbers, and the strings the run directory writes for non-finite floats."""
    return float(value) if value is not None else math.nan


def find_runs(root: Path) -> list[Path]:
    """Run directories (holding ``summary.json``) under ``root``, in a stable order (numeric job
    numbers sort numerically)."""
    runs = [p.parent for p in root.rglob("summary.json")]

    def key(p: Path) -> tuple:
        return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in p.relative_to(root).parts)

    return sorted(runs, key=key)


def sweep_rows(runs: Iterable[Path]) -> tuple[list[str], list[dict[str, Any]]]:
    """(swept keys, one row per run) — the swept keys are the config values that differ."""
    runs = list(runs)
    configs = []
    for run in runs:
        cfg = RunDirectory(run).read_config()
        if cfg is None:
            raise ConfigError(f"{run} has no config.yaml")
        configs.append({k: v for k, v in _flatten(cfg).items() if k not in IGNORED_KEYS})
    keys = sorted(set.intersection(*(set(c) for c in configs)))  # keys every run has
    swept = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    rows = []
    for run, cfg in zip(runs, configs):
        summary = _read_json(run / "summary.json")
        privacy = summary.get("privacy") or {}
        if not isinstance(summary.get("final"), dict) or "accuracy" not in summary["final"]:
            raise ConfigError(f"{run / 'summary.json'} is damaged: it has no final accuracy")
        degraded = summary.get("degraded")  # absent from runs older than the check
        rows.append({"run": str(run), **{k: cfg.get(k) for k in swept},
                     "final_accuracy": _as_float(summary["final"]["accuracy"]),
                     "final_loss": _as_float(summary["final"]["loss"]),
                     "degraded": "" if degraded is None else bool(degraded),
                     "cause": (summary.get("degradation") or {}).get("cause", ""),
                     "unigram_accuracy": _as_float(summary.get("unigram_accuracy")),
                     "epsilon": math.inf if privacy.get("non_private") else _as_float(privacy.get("epsilon")),
                     "non_private": bool(privacy.get("non_private")), "delta": privacy.get("delta"),
                     "mode": mode_label(privacy.get("randomness") or {}),
                     "rounds": summary.get("rounds"), "wall_s": _as_float(summary.get("wall_s"))})
    return swept, rows


def _csv(swept: list[str], rows: list[dict]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["run", *swept, "final_accuracy", "final_loss", "degraded", "cause",
                                             "unigram_accuracy", "epsilon", "non_private", "delta", "mode", "rounds",
                                             "wall_s"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def _pyplot():
    import matplotlib  # lazy: matplotlib (~0.6 s), kept off --help and the text report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after matplotlib.use("Agg")

    return plt


def _short(key: str) -> str:
    """``mechanism.name`` → ``mechanism``; other keys stay whole (``privacy.clip_norm``)."""
    return key[:-len(".name")] if key.endswith(".name") else key


def sweep_plot(swept: list[str], rows: list[dict]) -> bytes:
    """:func:`sweep_figure` as PNG bytes."""
    return _png_and_close(sweep_figure(swept, rows))


def curves_plot(run: Path) -> bytes:
    """:func:`curves_figure` as PNG bytes."""
    return _png_and_close(curves_figure(run))


def _png_and_close(fig) -> bytes:
    data = _png(fig)
    _pyplot().close(fig)
    return data


def epsilon_label(epsilon: float) -> str:
    """An epsilon as a tick label: 3 significant digits, no exponent below 10⁶ (7.999 → ``8``,
    9.999 → ``10``, 0.123456 → ``0.123``, 1234 → ``1230``): a calibrated run reads as its target."""
    return f"{float(f'{epsilon:.3g}'):g}" if abs(epsilon) < 1e6 else f"{epsilon:.3g}"


def epsilon_ticks(epsilons: Iterable[float], min_gap: float = 0.03) -> tuple[list[float], list[str]]:
    """Ticks of the sweep plot's (log) epsilon axis: (positions, labels), one per distinct finite
    positive epsilon, labelled by :func:`epsilon_label`. A tick whose label repeats the previous
    kept one, or that lies closer to it than ``min_gap`` of the axis's log span, is dropped (the
    smaller epsilon keeps its tick), so close values never print on top of each other."""
    values = sorted({float(e) for e in epsilons if math.isfinite(e) and e > 0})
    if not values:
        return [], []
    span = math.log10(values[-1]) - math.log10(values[0])
    positions: list[float] = []
    labels: list[str] = []
    for value in values:
        label = epsilon_label(value)
        if positions and (label == labels[-1] or math.log10(value / positions[-1]) < min_gap * span):
            continue
        positions.append(value)
        labels.append(label)
    return positions, labels


DEGRADED_LABEL = "degraded (the run's end-of-run check)"


def sweep_figure(swept: list[str], rows: list[dict]):
    """Final accuracy vs epsilon; one line per combination of the non-budget swept values. Non-private
    runs have no epsilon: they are drawn as horizontal reference lines labelled NOT PRIVATE. A run
    whose end-of-run check found it degraded is marked with a red cross (a non-private one says so in
    its label); the unigram baseline of the runs' data, where known, is a dotted line."""
    plt = _pyplot()
    series = [k for k in swept if k not in BUDGET_KEYS]
    lines: dict[str, list[tuple[float, float]]] = {}
    references: list[tuple[str, float]] = []
    degraded: list[tuple[float, float]] = []
    for row in rows:
        label = ", ".join(f"{_short(k)}={row[k]}" for k in series) or "runs"
        if row["non_private"]:
            note = " (degraded)" if row.get("degraded") is True else ""
            references.append((f"NOT PRIVATE (epsilon = inf): {label}{note}", row["final_accuracy"]))
        else:
            lines.setdefault(label, []).append((row["epsilon"], row["final_accuracy"]))
            if row.get("degraded") is True:
                degraded.append((row["epsilon"], row["final_accuracy"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    if degraded:
        ax.plot([p[0] for p in degraded], [p[1] for p in degraded], linestyle="none", marker="x", color="red",
                markersize=9, label=DEGRADED_LABEL)
    for label, accuracy in references:
        ax.axhline(accuracy, linestyle="--", color="gray", label=label)
    unigrams = sorted({row["unigram_accuracy"] for row in rows if math.isfinite(row.get("unigram_accuracy", math.nan))})
    for unigram in unigrams:  # one per dataset of the sweep
        ax.axhline(unigram, linestyle=":", color="black",
                   label="unigram baseline" + (f" {unigram:.4f}" if len(unigrams) > 1 else ""))
    ax.set_xscale("log")
    positions, labels = epsilon_ticks(row["epsilon"] for row in rows)
    if positions:  # plain tick labels at the budgets, not 2×10⁰
        from matplotlib.ticker import NullFormatter, NullLocator  # lazy: matplotlib, only when plotting

        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(positions, labels)
    ax.set_xlabel("epsilon (as reported by each run's accountant)")
    ax.set_ylabel("final test accuracy")
    ax.set_title(f"accuracy vs privacy budget\n({_mode_label(row['mode'] for row in rows)})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def curves_figure(run: Path):
    """Test accuracy (with the data's Bayes ceiling, dashed, when summary.json has one), test loss
    and epsilon spent (from 0) against the round (from metrics.jsonl: quantities the epsilon covers
    and test-set metrics only)."""
    plt = _pyplot()
    rows = RunDirectory(run).read_metrics()
    if not rows:
        raise ConfigError(f"{run}/metrics.jsonl is missing or has no rounds")
    summary = _read_json(run / "summary.json")
    privacy = summary.get("privacy") or {}
    evals = [r for r in rows if "test_accuracy" in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ax = axes[0]
    ax.plot([r["round"] for r in evals], [_as_float(r["test_accuracy"]) for r in evals], marker="o",
            label="test accuracy")
    ax.set(xlabel="round", ylabel="test accuracy", title="accuracy")
    ceiling = summary.get("ceiling_accuracy")  # synthetic data: the Bayes-optimal accuracy
    if ceiling:
        ax.axhline(_as_float(ceiling), linestyle="--", color="gray", label="Bayes ceiling")
        ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot([r["round"] for r in evals], [_as_float(r["test_loss"]) for r in evals], marker="o", label="test loss")
    ax.set(xlabel="round", ylabel="cross-entropy", title="test loss")
    ax = axes[2]
    if privacy.get("non_private") or any(r.get("non_private") for r in rows):
        reason = privacy.get("non_private_reason") or "no noise"
        ax.text(0.5, 0.5, f"NOT PRIVATE\nepsilon = inf\n({reason})", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, wrap=True)
        ax.set(xlabel="round", title="privacy", xticks=[], yticks=[])
    else:
        ax.plot([r["round"] for r in rows], [_as_float(r.get("epsilon")) for r in rows])
        ax.set(xlabel="round", ylabel="epsilon spent", title="privacy")
        ax.set_ylim(bottom=0)
    fig.suptitle(_mode_label([mode_label(privacy.get("randomness") or {})]), fontsize=9)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def report(path: Path) -> list[Path]:
    """Write the report for a run or a sweep directory; returns the files written."""
    if not path.is_dir():
        raise ConfigError(f"{path} is not a directory")
    if (path / "summary.json").exists():
        out = path / "curves.png"
        write_atomic(out, curves_plot(path))
        return [out]
    runs = find_runs(path)
    if not runs:
        raise ConfigError(f"{path} holds no finished run (no summary.json below it)")
    swept, rows = sweep_rows(runs)
    csv_bytes, png_bytes = _csv(swept, rows), sweep_plot(swept, rows)
    write_atomic(path / "sweep.csv", csv_bytes)
    write_atomic(path / "sweep.png", png_bytes)
    return [path / "sweep.csv", path / "sweep.png"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedpriv.report", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a run directory or a sweep (multirun) directory")
    args = parser.parse_args(argv)
    try:
        written = report(args.path)
    except (ConfigError, OutputError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
