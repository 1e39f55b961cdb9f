"""``python -m fedpriv.mechanisms rmse``: prefix-sum error of a noise mechanism.

    python -m fedpriv.mechanisms rmse --mechanism tree-efficient --rounds 128 --json
    python -m fedpriv.mechanisms rmse --mechanism bandmf --rounds 128 --bands 128 --json
    python -m fedpriv.mechanisms rmse --mechanism blt --rounds 2000 [--buffers auto|D]
        [--participations K --min-separation S] [--error mean|max] --json

RMSE (../shared/reference/KNOWN_ANSWERS.md): prefix sums over n rounds, one participation, unit
noise multiplier, ``sqrt(sens² · mean_t Var(prefix noise_t))`` with the mechanism's single-
participation sensitivity² (1 for independent noise and column-normalized BandMF, the
⌊log2 n⌋+1 nodes a round reaches in a tree). BandMF optimizes (or loads from the disk cache) its
strategy for n rounds and b bands. Computed from the mechanism's explicit noise matrix, so it checks
the online generator.
BLT (``fedpriv/mechanisms/blt.py``) optimises its buffers for the participation pattern (k
participations, at least S rounds strictly between two) and reports the seconds it took; BandMF
takes a pattern only where its bands cannot overlap (S ≥ b − 1: sensitivity² k).
Bad input: one ``error:`` line, exit 2.
"""

from __future__ import annotations

import sys
from typing import Sequence

import torch

from fedpriv.accounting.tree import max_sensitivity_sq
from fedpriv.mechanisms.bandmf import BandMFMechanism
from fedpriv.mechanisms.blt import ERRORS, MAX_BUFFERS, optimize_auto
from fedpriv.mechanisms.blt import optimize as optimize_blt
from fedpriv.mechanisms.analysis import prefix_rmse
from fedpriv.mechanisms.tree import TreeMechanism
from fedpriv.release.console import OneLineParser as _Parser
from fedpriv.errors import ConfigError
from fedpriv.release.rundir import json_text
from fedpriv.sampling import ParticipationBound
from fedpriv.schema import load, options

MAX_ROUNDS = 4096


def choices() -> list[str]:
    """Every registered mechanism, and ``tree-efficient`` (the tree with Honaker's estimator)."""
    return sorted([*options("mechanism"), "tree-efficient"])


def _registered_rmse(mechanism: str, rounds: int) -> float:
    """A registered mechanism whose noise matrix M is square (a factorization ``M = C⁻¹``): the
    single-participation sensitivity² is C's largest column norm²."""
    mech = load("mechanism", {"name": mechanism}).build(1.0, 1.0, rounds=rounds,
                                                        sampler=ParticipationBound(participations=1, min_separation=0))
    matrix = mech.matrix(rounds)
    if matrix.shape[0] != matrix.shape[1]:
        raise ConfigError(f"rmse of {mechanism} needs a square noise matrix (got {tuple(matrix.shape)})")
    strategy = torch.linalg.inv(matrix)
    return prefix_rmse(matrix, float(torch.linalg.vector_norm(strategy, dim=0).max() ** 2))


def rmse(mechanism: str, rounds: int, bands: int | None = None, participations: int = 1,
         separation: int = 0) -> float:
    """Prefix-sum RMSE of ``mechanism`` over ``rounds`` rounds (σ = 1; ``participations`` at least
    ``separation`` rounds apart — BandMF only where its bands do not overlap, s ≥ b − 1: then its
    sensitivity² is k times the largest column norm²)."""
    if mechanism == "bandmf":
        mech = BandMFMechanism(1.0, 1.0, rounds=rounds, bands=bands if bands is not None else rounds)
        sens_sq = float(torch.linalg.vector_norm(mech.strategy, dim=0).max() ** 2)
        return prefix_rmse(mech.matrix(rounds), sens_sq * participations)
    if mechanism not in ("tree", "tree-efficient"):
        return _registered_rmse(mechanism, rounds)
    estimator = "efficient" if mechanism == "tree-efficient" else "plain"
    matrix = TreeMechanism(1.0, 1.0, estimator=estimator).matrix(rounds)
    return prefix_rmse(matrix, max_sensitivity_sq(1, 0, rounds))


def blt_rmse(rounds: int, buffers: int | None, participations: int, separation: int, kind: str) -> tuple[float, dict]:
    """Optimise a BLT for the pattern (``buffers=None``: :func:`fedpriv.mechanisms.blt.optimize_auto`)."""
    if buffers is None:
        params, report = optimize_auto(rounds, participations, separation, kind)
    else:
        params, report = optimize_blt(rounds, buffers, participations, separation, kind)
        report["buffers"] = buffers
    report["weights"], report["decays"] = params.weights.tolist(), params.decays.tolist()
    return report["rmse"], report


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m fedpriv.mechanisms", description="Noise mechanism analysis.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cmd = sub.add_parser("rmse", help="prefix-sum RMSE at unit noise multiplier, single participation")
    cmd.add_argument("--mechanism", choices=choices(), required=True)
    cmd.add_argument("--rounds", type=int, required=True)
    cmd.add_argument("--bands", type=int, default=None, help="bandmf: bands b (default: rounds)")
    cmd.add_argument("--buffers", default="auto",
                     help="blt: buffers d in [1, 8], or auto (add buffers while each lowers the RMSE by >= 0.1%%)")
    cmd.add_argument("--participations", type=int, default=1, help="blt, bandmf: participations k")
    cmd.add_argument("--min-separation", type=int, default=None,
                     help="blt, bandmf: rounds strictly between two participations (default: none needed)")
    cmd.add_argument("--error", choices=ERRORS, default="mean", help="blt: minimise the mean or the max error")
    cmd.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be in [1, {MAX_ROUNDS}], got {args.rounds}")
    if args.bands is not None and not 1 <= args.bands <= args.rounds:
        parser.error(f"--bands must be in [1, rounds={args.rounds}], got {args.bands}")
    k, sep = args.participations, args.min_separation
    if k < 1 or (sep is not None and sep < 0) or (k > 1 and sep is None):
        parser.error("--participations must be >= 1, and more than one needs --min-separation >= 0")
    sep = sep or 0
    if k > 1 and (k - 1) * (sep + 1) >= args.rounds:
        parser.error(f"{k} participations {sep} rounds apart do not fit in {args.rounds} rounds")
    if (k > 1 or args.min_separation is not None) and args.mechanism not in ("blt", "bandmf"):
        parser.error("--participations / --min-separation apply to --mechanism blt or bandmf")
    bands = args.bands if args.bands is not None else args.rounds
    if args.mechanism == "bandmf" and k > 1 and sep < bands - 1:
        parser.error(f"bandmf with {k} participations is computed here only for --min-separation >= bands - 1 "
                     f"({bands - 1}), where its bands do not overlap")
    out: dict = {"mechanism": args.mechanism, "rounds": args.rounds}
    if args.mechanism == "blt":
        buffers = None if args.buffers == "auto" else _buffers(parser, args.buffers)
        value, report = blt_rmse(args.rounds, buffers, k, sep, args.error)
        out.update(report, participations=k, min_separation=sep, error=args.error)
    else:
        try:
            value = rmse(args.mechanism, args.rounds, args.bands, k, sep)
        except ConfigError as err:
            parser.error(str(err))
    out["rmse"] = value
    if args.mechanism == "bandmf":
        out.update(bands=bands, participations=k, min_separation=sep)
    extra = f", {out['buffers']} buffers, {out['seconds']:.1f} s to optimise" if args.mechanism == "blt" else ""
    print(json_text(out) if args.json else
          f"{args.mechanism}: prefix-sum RMSE {value:.4f} over {args.rounds} rounds{extra}")
    return 0


def _buffers(parser, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BUFFERS:
        parser.error(f"--buffers must be auto or an integer in [1, {MAX_BUFFERS}], got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
