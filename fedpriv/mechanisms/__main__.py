"""``python -m fedpriv.mechanisms rmse``: prefix-sum error of a noise mechanism.

    python -m fedpriv.mechanisms rmse --mechanism tree-efficient --rounds 128 --json
    python -m fedpriv.mechanisms rmse --mechanism bandmf --rounds 128 --bands 128 --json

RMSE (../shared/reference/KNOWN_ANSWERS.md): prefix sums over n rounds, one participation, unit
noise multiplier, ``sqrt(sens² · mean_t Var(prefix noise_t))`` with the mechanism's single-
participation sensitivity² (1 for independent noise and column-normalized BandMF, the
⌊log2 n⌋+1 nodes a round reaches in a tree). BandMF optimizes (or loads from the disk cache) its
strategy for n rounds and b bands. Computed from the mechanism's explicit noise matrix, so it checks the online generator.
Bad input: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch

from fedpriv.accounting.tree import max_sensitivity_sq
from fedpriv.mechanisms.bandmf import BandMFMechanism
from fedpriv.mechanisms.gaussian import GaussianMechanism
from fedpriv.mechanisms.analysis import prefix_rmse
from fedpriv.mechanisms.tree import TreeMechanism
from fedpriv.console import OneLineParser as _Parser
from fedpriv.rundir import json_text

CHOICES = ("gaussian", "tree", "tree-efficient", "bandmf")
MAX_ROUNDS = 4096


def rmse(mechanism: str, rounds: int, bands: int | None = None) -> float:
    """Prefix-sum RMSE of ``mechanism`` over ``rounds`` rounds (single participation, σ = 1)."""
    if mechanism == "bandmf":
        mech = BandMFMechanism(1.0, 1.0, rounds=rounds, bands=bands if bands is not None else rounds)
        sens_sq = float(torch.linalg.vector_norm(mech.strategy, dim=0).max() ** 2)
        return prefix_rmse(mech.matrix(rounds), sens_sq)
    if mechanism == "gaussian":
        return prefix_rmse(GaussianMechanism(1.0, 1.0).matrix(rounds), 1.0)
    estimator = "efficient" if mechanism == "tree-efficient" else "plain"
    matrix = TreeMechanism(1.0, 1.0, estimator=estimator).matrix(rounds)
    return prefix_rmse(matrix, max_sensitivity_sq(1, 0, rounds))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m fedpriv.mechanisms", description="Noise mechanism analysis.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cmd = sub.add_parser("rmse", help="prefix-sum RMSE at unit noise multiplier, single participation")
    cmd.add_argument("--mechanism", choices=CHOICES, required=True)
    cmd.add_argument("--rounds", type=int, required=True)
    cmd.add_argument("--bands", type=int, default=None, help="bandmf: bands b (default: rounds)")
    cmd.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be in [1, {MAX_ROUNDS}], got {args.rounds}")
    if args.bands is not None and not 1 <= args.bands <= args.rounds:
        parser.error(f"--bands must be in [1, rounds={args.rounds}], got {args.bands}")
    value = rmse(args.mechanism, args.rounds, args.bands)
    out = {"rmse": value, "mechanism": args.mechanism, "rounds": args.rounds}
    if args.mechanism == "bandmf":
        out["bands"] = args.bands if args.bands is not None else args.rounds
    print(json_text(out) if args.json else f"{args.mechanism}: prefix-sum RMSE {value:.4f} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
