"""``python -m fedpriv.audit``: the audit of a run, or the one-run lower bound for given counts.

Examples::

    python -m fedpriv.audit outputs/2026-12-01/10-00-00          # recompute from audit_scores.json
    python -m fedpriv.audit RUN_DIR --confidence 0.99 --json
    python -m fedpriv.audit bound --canaries 1000 --guesses 100 --correct 98 --delta 1e-5 --json

Bad input prints one ``error: ...`` line on stderr and exits 2; nothing is written.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from fedpriv.audit.bound import epsilon_lower_bound
from fedpriv.audit.report import analyse, headline, read_scores
from fedpriv.release.console import OneLineParser, fail
from fedpriv.errors import ConfigError, DamagedFileError
from fedpriv.release.rundir import json_text


def _confidence(text: str) -> float:
    value = _number(text)
    if not 0 < value < 1:
        raise ValueError
    return value


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError
    return value


def bound_main(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog="python -m fedpriv.audit bound",
                           description="the one-run lower bound on epsilon for given counts")
    parser.add_argument("--canaries", type=int, required=True, help="canaries with a secret coin (m)")
    parser.add_argument("--guesses", type=int, required=True, help="canaries guessed 'included' (r)")
    parser.add_argument("--correct", type=int, required=True, help="right guesses (v)")
    parser.add_argument("--delta", type=_number, required=True)
    parser.add_argument("--confidence", type=_confidence, default=0.95, help="in (0, 1); default 0.95")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 0 <= args.correct <= args.guesses <= args.canaries or args.canaries < 1:
        fail(f"need 0 <= correct <= guesses <= canaries and canaries >= 1, got correct {args.correct}, "
             f"guesses {args.guesses}, canaries {args.canaries}")
    if not 0 <= args.delta < 1:
        fail(f"--delta must be in [0, 1), got {args.delta}")
    eps = epsilon_lower_bound(args.canaries, args.guesses, args.correct, args.delta, args.confidence)
    out = {"canaries": args.canaries, "guesses": args.guesses, "correct": args.correct, "delta": args.delta,
           "confidence": args.confidence, "epsilon_lower_bound": eps}
    print(json_text(out) if args.json else
          f"epsilon lower bound {eps:.6g} at delta {args.delta:g} ({args.confidence:.0%} confidence; "
          f"{args.correct} of {args.guesses} guesses right, {args.canaries} canaries)")
    return 0


def run_main(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog="python -m fedpriv.audit",
                           description="recompute a run's audit from RUN_DIR/audit_scores.json "
                                       "(or: python -m fedpriv.audit bound --help)")
    parser.add_argument("run_dir")
    parser.add_argument("--confidence", type=_confidence, default=None, help="default: the run's audit.confidence")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = analyse(read_scores(args.run_dir), args.confidence)
    except (ConfigError, DamagedFileError, ValueError) as err:
        fail(str(err))
    print(json_text(result, indent=2) if args.json else headline(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bound"]:
        return bound_main(argv[1:])
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
