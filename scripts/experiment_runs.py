"""Shared by the results scripts: run ``python -m fedpriv.simulate`` once per named run, skipping
runs whose ``summary.json`` already exists (one at a time, or ``jobs`` at a time with one torch
thread each), and read the summaries back."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from fedpriv.release.rundir import read_mapping  # noqa: E402


def run_once(path: Path, overrides: Sequence[str], threads: int | None = None) -> Path:
    """``python -m fedpriv.simulate OVERRIDES run_dir=PATH`` unless PATH already holds a finished run;
    ``threads`` caps torch's threads (``OMP_NUM_THREADS``) for runs that share the machine."""
    if not (path / "summary.json").exists():
        env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        args = [*overrides, "progress=false", f"run_dir={path}"]
        print("python -m fedpriv.simulate", " ".join(args), flush=True)
        subprocess.run([sys.executable, "-m", "fedpriv.simulate", *args], check=True, env=env,
                       stdout=subprocess.DEVNULL if threads else None)
    return path


def run_all(out: Path, named: Mapping[str, Sequence[str]], jobs: int = 1) -> None:
    """Every ``name → overrides`` into ``OUT/<name>/``, in order, ``jobs`` at a time (more than one:
    one torch thread each, so wall times are then not comparable with single runs)."""
    threads = 1 if jobs > 1 else None
    with ThreadPoolExecutor(jobs) as pool:
        for f in [pool.submit(run_once, out / k, v, threads) for k, v in named.items()]:
            f.result()


def summary(path: Path) -> dict | None:
    """The run's summary.json, or None while it has not finished."""
    f = path / "summary.json"
    return read_mapping(f, json.loads) if f.exists() else None


def final_and_best(path: Path) -> tuple[dict, dict]:
    """The run's last test evaluation and its lowest-loss one (metrics.jsonl rows with a test_loss)."""
    rows = map(json.loads, (path / "metrics.jsonl").read_text().splitlines())
    evals = [r for r in rows if "test_loss" in r]
    return evals[-1], min(evals, key=lambda r: r["test_loss"])


def results_parser(description: str, out: Path) -> argparse.ArgumentParser:
    """The options every results script shares: ``--out``, ``--only``, ``--table``, ``--json``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--only", nargs="*", help="run only these names, in this order (default: all)")
    parser.add_argument("--table", action="store_true", help="print the table of the finished runs")
    parser.add_argument("--json", type=Path, help="write the rows of the finished runs here")
    return parser


def check_names(only: Sequence[str] | None, todo: Mapping[str, Sequence[str]]) -> None:
    """Exit 2 with one ``error:`` line when ``--only`` names a run the script does not have."""
    unknown = sorted(set(only or ()) - set(todo))
    if unknown:
        print(f"error: unknown run names: {', '.join(unknown)} (known: {', '.join(todo)})", file=sys.stderr)
        raise SystemExit(2)


def report(args: argparse.Namespace, todo: Mapping[str, Sequence[str]],
           row: Callable[[str, Path, Sequence[str]], dict | None], table: Callable[[list[dict]], str]) -> None:
    """``--table`` / ``--json``: the rows of the finished runs of ``todo`` under ``args.out``."""
    rows = [r for k, v in todo.items() if (r := row(k, args.out / k, v)) is not None]
    if args.table:
        print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def markdown_table(head: str, lines: Iterable[str]) -> str:
    """``head``, its separator row, then ``lines``."""
    return "\n".join([head, "|" + "---|" * head.count(" | ") + "---|", *lines])
