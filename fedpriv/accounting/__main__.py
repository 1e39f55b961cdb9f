"""``python -m fedpriv.accounting``: epsilon for a noise multiplier, or noise for a target epsilon.

Examples::

    python -m fedpriv.accounting epsilon --noise-multiplier 1.1 --sampling-rate 0.0042667 \\
        --rounds 14063 --delta 1e-5 --accountant pld --json
    python -m fedpriv.accounting noise --target-epsilon 2 --sampling-rate 0.01 --rounds 1000 --delta 1e-5
    python -m fedpriv.accounting delta --epsilon 2 --noise-multiplier 1.5 --sampling balls_in_bins \
        --bins 66 --rounds 220 --mechanism bandmf --strategy-column 0.9,0.4,0.2 --json
    python -m fedpriv.accounting ddgauss --target-epsilon 2 --delta 1e-5 --sampling-rate 0.01 \
        --rounds 100 --shares 100 --dim 4000 --bits 16

Balls-in-bins sampling is accounted by Monte Carlo (``--accountant mc``, its default there;
:mod:`fedpriv.accounting.monte_carlo`): the claimed epsilon and delta are upper bounds holding
with ``--confidence`` over the accountant's public samples, reported beside their point estimates.
``noise`` shares that confidence over the σ grid it searches; ``epsilon`` and ``delta`` (a σ given
as is) do not need to.

The DpEvent always comes from the mechanism object, built through its registered option (so a
mechanism registered with ``fedpriv.schema.register_option`` is here too), and a sampler built by
``fedpriv.sampling.make_sampler`` (so is a kind registered with ``register_sampler``: it reads
``--population`` and ``--cohort``). This file only parses and prints; what a sub-command computes is
:mod:`fedpriv.accounting.calculator`, loaded (with torch, through the samplers and mechanisms) once a
sub-command is parsed, so ``--help`` stays light. Bad input prints one line ``error: ...`` on stderr
and exits 2.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any, Callable, Sequence

from fedpriv.release.console import OneLineParser as _Parser
from fedpriv.release.console import console_logging, fail as _fail
from fedpriv.errors import ConfigError


class _Command(_Parser):
    """A sub-command whose arguments are added when it is used (parsed, or its help printed):
    they list the registered mechanisms and sampler kinds, whose modules import torch, which the
    calculator's own ``--help`` does not need."""

    def __init__(self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def _add_arguments(self) -> None:
        if self._arguments is not None:
            add, self._arguments = self._arguments, None
            add(self)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._add_arguments()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._add_arguments()
        return super().format_usage()

    def format_help(self) -> str:
        self._add_arguments()
        return super().format_help()


def _accounting_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The arguments of ``epsilon``, ``noise`` and ``delta``."""
    # lazy: the registries' modules import torch; only a parsed sub-command (or its help) needs them
    from fedpriv.accounting.accountant import ACCOUNTANTS
    from fedpriv.accounting.calculator import mechanism_names, sampling_kinds
    from fedpriv.accounting.monte_carlo import MonteCarloSettings

    if command in ("epsilon", "delta"):
        parser.add_argument("--noise-multiplier", type=float, required=True, help="sigma (noise std / clip norm)")
    if command == "noise":
        parser.add_argument("--target-epsilon", type=float, required=True)
    if command == "delta":
        parser.add_argument("--epsilon", type=float, required=True, help="epsilon > 0")
    parser.add_argument("--mechanism", choices=mechanism_names(), default="gaussian",
                        help="a registered mechanism; its option's keys: --bands, --buffers, --restart-every, --set")
    parser.add_argument("--sampling-rate", type=float, default=None,
                        help="q in (0, 1] (poisson / fixed sampling)")
    parser.add_argument("--rounds", type=int, required=True, help="number of rounds / steps T >= 1")
    if command != "delta":
        parser.add_argument("--delta", type=float, required=True, help="delta in (0, 1)")
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default=None,
                        help="rdp (default) | pld | mc (Monte Carlo: the default and only one for balls_in_bins)")
    parser.add_argument("--sampling", choices=sampling_kinds(), default=None,
                        help="default: poisson where the mechanism's own default is, else cyclic (tree, bandmf, "
                             "blt) | fixed | cyclic_poisson (bandmf, amplified; needs --population, --cohort) | "
                             "balls_in_bins (gaussian, bandmf, blt; needs --bins) | b_min_sep (bandmf; needs "
                             "--population, --cohort, --bands: participations >= bands rounds apart)")
    parser.add_argument("--bins", type=int, default=None,
                        help="balls_in_bins: each user takes part in the rounds t = bin (mod bins)")
    parser.add_argument("--strategy-column", default=None, metavar="C0,C1,...",
                        help="bandmf with balls_in_bins: the first column of a Toeplitz C, taken as is (sigma "
                             "multiplies the clip norm; C is not renormalised); default: the optimized strategy")
    parser.add_argument("--mc-samples", type=int, default=None,
                        help="mc: samples per direction of the dominating pair (default 50/delta)")
    parser.add_argument("--confidence", type=float, default=None,
                        help=f"mc: probability that the claimed bound holds (default {MonteCarloSettings.confidence})")
    parser.add_argument("--mc-seed", type=int, default=None,
                        help="mc: public seed of the accountant's samples (default 0); seed k's claims fail with "
                             "probability (1 - confidence)*6/(pi^2 (k+1)^2), so trying seeds cannot buy a lucky claim")
    parser.add_argument("--bands", type=int, default=None, help="bandmf: number of bands b")
    parser.add_argument("--buffers", type=int, default=None, help="blt: buffers d (default: auto)")
    parser.add_argument("--population", type=int, default=None,
                        help="population N (--sampling fixed: cohort = round(q*N); cyclic: with --cohort)")
    parser.add_argument("--cohort", type=int, default=None, help="cohort size per round (--sampling cyclic)")
    parser.add_argument("--participations", type=int, default=None,
                        help="tree: each user takes part at most this often (default 1, single epoch)")
    parser.add_argument("--min-separation", type=int, default=None,
                        help="tree: rounds strictly between two participations of a user")
    parser.add_argument("--restart-every", type=int, default=None, help="tree: a new tree every k rounds")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="any other key of the mechanism's option (repeatable), e.g. --set error=max")
    parser.add_argument("--json", action="store_true", help="print one JSON line")


def _ddgauss_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``ddgauss``."""
    parser.add_argument("--target-epsilon", type=float, required=True)
    parser.add_argument("--delta", type=float, required=True, help="delta in (0, 1)")
    parser.add_argument("--sampling-rate", type=float, required=True, help="q in (0, 1]: Poisson sampling of the users")
    parser.add_argument("--rounds", type=int, required=True, help="number of rounds T >= 1")
    parser.add_argument("--clip", type=float, default=1.0, help="each client's L2 clip norm c")
    parser.add_argument("--shares", type=int, required=True,
                        help="noise shares every released sum is guaranteed to hold (the fewest surviving clients)")
    parser.add_argument("--dim", type=int, required=True, help="the update's coordinates (padded to a power of two)")
    parser.add_argument("--bits", type=int, default=16, help="bits per coordinate of the secure sum (default 16)")
    parser.add_argument("--k", type=float, default=4.0, help="standard deviations of the sum the bits must hold")
    parser.add_argument("--json", action="store_true", help="print one JSON line")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fedpriv.accounting",
                     description="Privacy accounting with dp_accounting (RDP, PLD) or Monte Carlo (balls-in-bins).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Command)
    for command, text in (("epsilon", "epsilon spent for a given noise multiplier"),
                          ("noise", "smallest noise multiplier for a target epsilon"),
                          ("delta", "delta at a given epsilon for a given noise multiplier")):
        sub.add_parser(command, help=text, arguments=functools.partial(_accounting_arguments, command=command))
    sub.add_parser("ddgauss", help="plan the distributed discrete Gaussian (secure aggregation): grid step "
                                   "and each client's noise for a target epsilon and a bit width",
                   arguments=_ddgauss_arguments)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    console_logging()  # only the result on stdout; warnings as warning: lines
    args = build_parser().parse_args(argv)
    from fedpriv.accounting.calculator import result  # lazy: torch (samplers, mechanisms), after the parse

    try:
        text = result(args)
    except ConfigError as err:
        _fail(str(err))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
