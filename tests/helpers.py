"""Helpers only the tests use (moved out of fedpriv/, which keeps only what it runs): brute-force
oracles of the sensitivity programs and small views of generated data (the ``tf.train.Example``
writer for StackOverflow-schema files is :mod:`fedpriv.data.stackoverflow_writer`)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import torch

from fedpriv.accounting.tree import tree_accounting
from fedpriv.data.federated import FederatedDataset
from fedpriv.keys.randomness import ClientDraws
from fedpriv.keys.research_key import clients_from_seed


# ------------------------------------------------------------------ tree aggregation (fedpriv.accounting.tree)

def brute_force_sensitivity_sq(participations: int, separation: int, rounds: int) -> int:
    """The same worst case by enumerating placements (small cases; for tests)."""
    nodes = [(s, s + 2 ** h) for h in range(rounds.bit_length()) for s in range(0, rounds, 2 ** h)
             if s + 2 ** h <= rounds]
    best = 0
    for places in itertools.combinations(range(rounds), participations):
        if any(b - a - 1 < separation for a, b in zip(places, places[1:])):
            continue
        total = sum(sum(lo <= p < hi for p in places) ** 2 for lo, hi in nodes)
        best = max(best, total)
    return best


def tree_event(noise_multiplier: float, rounds: int, participations: int, separation: int,
               restart_every: int | None = None, planned_rounds: int | None = None,
               planned_participations: int | None = None) -> dp_accounting.DpEvent:
    """The event of :func:`tree_accounting`."""
    return tree_accounting(noise_multiplier, rounds, participations, separation, restart_every, planned_rounds,
                           planned_participations)[0]


# ------------------------------------------------------------------ BandMF (fedpriv.mechanisms.bandmf)

def sensitivity_sq_brute_force(c: torch.Tensor, participations: int, min_gap: int) -> float:
    """``max_π Σ_{i,j∈π} |(CᵀC)_{ij}|`` over participation sets π of size k whose indices differ
    by at least ``min_gap`` (worst case over the users' unit-norm contributions)."""
    gram = (c.T @ c).abs()
    n = c.shape[0]
    best = 0.0
    for pattern in itertools.combinations(range(n), participations):
        if any(b - a < min_gap for a, b in zip(pattern, pattern[1:])):
            continue
        idx = torch.tensor(pattern)
        best = max(best, float(gram[idx][:, idx].sum()))
    return best


# ------------------------------------------------------------------ generated data


def user_sizes(ds: FederatedDataset) -> np.ndarray:
    """Sentences per training user."""
    return np.array([len(u) for u in ds.users], dtype=np.int64)


# ------------------------------------------------------------------ interrupted runs

class Killed(RuntimeError):
    """Raised in place of a round to stand for the process being killed."""


def interrupt_and_resume(cfg: dict, crash_round: int, before_resume=None):
    """Run ``cfg`` in process until it is "killed" during round ``crash_round`` (0-based, after
    the previous round's checkpoint), then prepare its resume; returns ``(first, resumed)``.
    ``before_resume(cfg) -> cfg``: what changes between the two (a newer fedpriv, say)."""
    import pytest

    from client.app import make_client_app
    from fedpriv.runner import prepare, train
    from server.app import grid_round_fn
    from server.grid import LocalGrid

    first = prepare(cfg)
    inner = grid_round_fn(LocalGrid(make_client_app(cfg)), 1, None)

    def crashing(inputs):
        if inputs.round_idx == crash_round:
            raise Killed
        return inner(inputs)

    with pytest.raises(Killed):
        train(first, crashing)
    if before_resume is not None:
        cfg = before_resume(cfg)
    return first, prepare({**cfg, "resume": True})


def run_dir_files(run_dir: Path) -> set[str]:
    """What a run left in its directory: the top-level names, and the files under checkpoints/
    (as :func:`fedpriv.release.run_outputs.planned_outputs` names them)."""
    names = {p.name for p in run_dir.iterdir() if p.name != "checkpoints"}
    return names | {f"checkpoints/{p.name}" for p in (run_dir / "checkpoints").iterdir()}


def client_draws(seed: int) -> ClientDraws:
    """A client's reproducible draws for tests: research mode, derived from ``seed``."""
    return clients_from_seed(seed).draws(0, 0)


def assert_script_runs(script: str, timeout: float = 120) -> None:
    """Run ``python -c script`` in a fresh interpreter at the repository root (what a fresh process
    imports, e.g.) and fail with its stderr unless it exits 0."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr


def call_main(main, capsys, *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` of a command-line module, in-process: (exit code, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err
