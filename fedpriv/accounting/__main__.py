"""``python -m fedpriv.accounting``: epsilon for a noise multiplier, or noise for a target epsilon.

Examples::

    python -m fedpriv.accounting epsilon --noise-multiplier 1.1 --sampling-rate 0.0042667 \\
        --rounds 14063 --delta 1e-5 --accountant pld --json
    python -m fedpriv.accounting noise --target-epsilon 2 --sampling-rate 0.01 --rounds 1000 --delta 1e-5

The DpEvent always comes from the mechanism object, built through its registered option (so a
mechanism registered with ``fedpriv.schema.register_option`` is here too), and a sampler of
``fedpriv.sampling``; this file only parses, validates and prints. Bad input prints one line
``error: ...`` on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from typing import Any, Sequence

import dp_accounting

from fedpriv.accounting.accountant import (ACCOUNTANTS, RDP, calibrate_noise_multiplier,
                                           check_delta, check_epsilon, compute_epsilon,
                                           relation_name)
from fedpriv.accounting.ledger import json_epsilon
from fedpriv.console import console_handler, fail as _fail
from fedpriv.console import OneLineParser as _Parser
from fedpriv.errors import ConfigError
from fedpriv.rundir import json_text
from fedpriv.schema import MechanismOption, load, option_preset, options
from fedpriv.sampling import (CYCLIC, CYCLIC_POISSON, FIXED_SIZE, POISSON, CyclicPoissonSampler, CyclicSampler,
                              FixedSizeSampler, ParticipationBound, PoissonSampler, Sampler)



# calculator flags that set a field of the chosen mechanism's option (any other field: --set KEY=VALUE)
OPTION_FLAGS = {"bands": "bands", "buffers": "buffers", "restart_every": "restart_every"}


def mechanism_names() -> list[str]:
    """The registered mechanisms (``fedpriv.schema.register_option("mechanism", ...)``)."""
    return sorted(options("mechanism"))


def mechanism_option(args: argparse.Namespace) -> MechanismOption:
    """The registered option of ``--mechanism``, its fields from the flags (checked by its schema).
    A field its accounting depends on (``accounting_fields``) must be given: a calculator never
    guesses a band count."""
    fields: dict[str, Any] = {}
    for flag, key in OPTION_FLAGS.items():
        if getattr(args, flag) is not None:
            fields[key] = getattr(args, flag)
    for item in args.set or ():
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set takes KEY=VALUE, got {item!r}")
        try:
            fields[key] = json.loads(text)
        except json.JSONDecodeError:
            fields[key] = text
    preset = option_preset("mechanism", args.mechanism)
    known = {f.name for f in dataclasses.fields(preset)}
    for key in fields:
        if key not in known:
            flag = next((f"--{f.replace('_', '-')}" for f, k in OPTION_FLAGS.items() if k == key), f"--set {key}=")
            raise ConfigError(f"{flag} does not apply to --mechanism {args.mechanism} (its keys: "
                              f"{', '.join(sorted(known - {'name'}))})")
    for key in getattr(preset, "accounting_fields", ()):
        if key not in fields:
            flag = next((f"--{f.replace('_', '-')}" for f, k in OPTION_FLAGS.items() if k == key), f"--set {key}=")
            raise ConfigError(f"--mechanism {args.mechanism} needs {flag.rstrip('=')}")
    return load("mechanism", {"name": args.mechanism, **fields})


def _build(args: argparse.Namespace, noise_multiplier: float, sampler) -> Any:
    """The mechanism through its registered option, at clip norm 1 (events are per unit of
    sensitivity), sized for ``--rounds`` and the sampler's pattern."""
    return mechanism_option(args).build(noise_multiplier, 1.0, rounds=args.rounds, sampler=sampler)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m fedpriv.accounting",
                     description="Privacy accounting with dp_accounting (RDP or PLD).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    eps = sub.add_parser("epsilon", help="epsilon spent for a given noise multiplier")
    eps.add_argument("--noise-multiplier", type=float, required=True, help="sigma (noise std / clip norm)")
    noise = sub.add_parser("noise", help="smallest noise multiplier for a target epsilon")
    noise.add_argument("--target-epsilon", type=float, required=True)
    for p in (eps, noise):
        p.add_argument("--mechanism", choices=mechanism_names(), default="gaussian",
                       help="a registered mechanism; its option's keys: --bands, --buffers, --restart-every, --set")
        p.add_argument("--sampling-rate", type=float, default=None,
                       help="q in (0, 1] (poisson / fixed sampling)")
        p.add_argument("--rounds", type=int, required=True, help="number of rounds / steps T >= 1")
        p.add_argument("--delta", type=float, required=True, help="delta in (0, 1)")
        p.add_argument("--accountant", choices=ACCOUNTANTS, default=RDP)
        p.add_argument("--sampling", choices=(POISSON, FIXED_SIZE, CYCLIC, CYCLIC_POISSON), default=None,
                       help="default: poisson where the mechanism's own default is, else cyclic (tree, bandmf, "
                            "blt) | fixed | cyclic_poisson (bandmf, amplified; needs --population, --cohort)")
        p.add_argument("--bands", type=int, default=None, help="bandmf: number of bands b")
        p.add_argument("--buffers", type=int, default=None, help="blt: buffers d (default: auto)")
        p.add_argument("--population", type=int, default=None,
                       help="population N (--sampling fixed: cohort = round(q*N); cyclic: with --cohort)")
        p.add_argument("--cohort", type=int, default=None, help="cohort size per round (--sampling cyclic)")
        p.add_argument("--participations", type=int, default=None,
                       help="tree: each user takes part at most this often (default 1, single epoch)")
        p.add_argument("--min-separation", type=int, default=None,
                       help="tree: rounds strictly between two participations of a user")
        p.add_argument("--restart-every", type=int, default=None, help="tree: a new tree every k rounds")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="any other key of the mechanism's option (repeatable), e.g. --set error=max")
        p.add_argument("--json", action="store_true", help="print one JSON line")
    return parser


def _validate(args: argparse.Namespace) -> None:
    check_delta(args.delta)
    if args.sampling is None:  # a calculator has no population: correlated noise defaults to cyclic
        args.sampling = POISSON if option_preset("mechanism", args.mechanism).default_sampling == POISSON else CYCLIC
    if args.sampling in (POISSON, FIXED_SIZE):
        if args.sampling_rate is None:
            raise ConfigError(f"--sampling {args.sampling} needs --sampling-rate")
        if not (math.isfinite(args.sampling_rate) and 0.0 < args.sampling_rate <= 1.0):
            raise ConfigError(f"sampling rate must be in (0, 1], got {args.sampling_rate}")
    for name in ("cohort", "participations", "restart_every", "bands"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.min_separation is not None and args.min_separation < 0:
        raise ConfigError(f"--min-separation must be >= 0, got {args.min_separation}")
    if args.rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {args.rounds}")
    if args.population is not None and args.population < 1:
        raise ConfigError(f"population must be >= 1, got {args.population}")
    if args.command == "epsilon" and not (math.isfinite(args.noise_multiplier) and args.noise_multiplier >= 0):
        raise ConfigError(f"noise multiplier must be a finite number >= 0, got {args.noise_multiplier}")
    if args.command == "noise":
        check_epsilon(args.target_epsilon)


def make_cli_sampler(kind: str, rate: float | None, population: int | None,
                     args: argparse.Namespace | None = None) -> Sampler | ParticipationBound:
    """The sampler the accountant must assume (no key: a calculator never draws a cohort)."""
    if kind == CYCLIC_POISSON:
        groups = mechanism_option(args).sampling_groups() if args is not None else None
        if args is None or args.population is None or args.cohort is None or groups is None:
            raise ConfigError("--sampling cyclic_poisson needs --population, --cohort and a mechanism with groups "
                              "(--bands)")
        if args.cohort * groups > args.population:
            raise ConfigError(f"--cohort x --bands = {args.cohort * groups} exceeds --population {args.population}")
        return CyclicPoissonSampler(population=args.population, cohort=args.cohort, groups=groups)
    if kind == CYCLIC:
        if args is not None and args.population is not None and args.cohort is not None:
            if args.cohort > args.population:
                raise ConfigError(f"--cohort {args.cohort} exceeds --population {args.population}")
            return CyclicSampler(population=args.population, cohort=args.cohort)
        k = args.participations if args is not None and args.participations else 1
        sep = args.min_separation if args is not None and args.min_separation is not None else None
        if k > 1 and sep is None:
            raise ConfigError("--participations > 1 needs --min-separation (or --population and --cohort)")
        return ParticipationBound(participations=k, min_separation=sep if sep is not None else 0)
    if kind == POISSON:
        # Poisson accounting depends only on q; the population is informational here.
        return PoissonSampler(population=population or 0, rate=rate)
    if population is None:
        raise ConfigError("--sampling fixed needs --population (cohort = round(q * N))")
    cohort = round(rate * population)
    if not 1 <= cohort <= population:
        raise ConfigError(f"fixed-size cohort round({rate} * {population}) = {cohort} is not in [1, {population}]")
    return FixedSizeSampler(population=population, cohort=cohort)


def _epsilon(args: argparse.Namespace, sampler: Sampler) -> dict[str, Any]:
    mechanism = _build(args, args.noise_multiplier, sampler)
    relation = mechanism.neighboring_relation(sampler)
    eps = compute_epsilon(mechanism.dp_event(sampler, args.rounds), args.delta, args.accountant, relation)
    return _with_epsilon(mechanism.accounting_details(sampler, args.rounds), eps, args, relation)


def _noise(args: argparse.Namespace, sampler: Sampler) -> dict[str, Any]:
    mechanism = _build(args, 1.0, sampler)
    relation = mechanism.neighboring_relation(sampler)

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return mechanism.dp_event(sampler, args.rounds, noise_multiplier=sigma)

    sigma = calibrate_noise_multiplier(make_event, args.target_epsilon, args.delta, args.accountant, relation)
    eps = compute_epsilon(make_event(sigma), args.delta, args.accountant, relation)
    out = {"noise_multiplier": sigma, "target_epsilon": args.target_epsilon,
           **mechanism.accounting_details(sampler, args.rounds)}
    return _with_epsilon(out, eps, args, relation)


def _with_epsilon(out: dict[str, Any], eps: float, args: argparse.Namespace,
                  relation: dp_accounting.NeighboringRelation) -> dict[str, Any]:
    out.update({"epsilon": json_epsilon(eps), "delta": args.delta, "accountant": args.accountant,
                "neighboring_relation": relation_name(relation)})
    if math.isinf(eps):
        out["non_private"] = True
    return out


def _human(args: argparse.Namespace, out: dict[str, Any]) -> str:
    eps = "inf (non-private)" if out["epsilon"] is None else f"{out['epsilon']:.6g}"
    head = f"noise_multiplier = {out['noise_multiplier']:.6g}, " if "noise_multiplier" in out else ""
    trees = out.get("tree_sensitivity")
    tail = ""
    if isinstance(trees, list):
        tail = "; " + ", ".join(f"sum of sensitivity^2 {t['sum_sensitivity_sq']} ({t['method']})" for t in trees)
    return (f"{head}epsilon = {eps} at delta = {args.delta:g} ({args.accountant} accountant, "
            f"{out['neighboring_relation']} neighbouring, {args.mechanism} mechanism, "
            f"{_sampling_text(args)}, {_plural(args.rounds, 'round')}{tail})")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _sampling_text(args: argparse.Namespace) -> str:
    if args.sampling == CYCLIC_POISSON:
        return f"cyclic Poisson sampling of {args.cohort} from {args.population} in {args.bands} groups"
    if args.sampling != CYCLIC:
        return f"{args.sampling} sampling q = {args.sampling_rate:g}"
    if args.population is not None and args.cohort is not None:
        return f"cyclic sampling of {args.cohort} from {args.population}"
    return (f"at most {_plural(args.participations or 1, 'participation')}"
            + (f" >= {args.min_separation} rounds apart" if args.min_separation is not None else ""))


def quiet_logging() -> None:
    """Only the result on the console. dp_accounting's RDP code logs an absl warning for every
    order that does not converge (~30 per calibration): dropped. absl's first log call would also
    give the root logger Python's default ``WARNING:name:`` handler; instead (when nothing has
    configured logging yet) fedpriv's own warnings, e.g. a tree sensitivity bound used instead of
    the exact value, print on stderr as ``warning: ...``."""
    logging.getLogger("absl").setLevel(logging.ERROR)
    if not logging.root.handlers:
        logging.root.addHandler(console_handler(sys.stderr))


def main(argv: Sequence[str] | None = None) -> int:
    quiet_logging()
    args = build_parser().parse_args(argv)
    try:
        _validate(args)
        sampler = make_cli_sampler(args.sampling, args.sampling_rate, args.population, args)
    except ConfigError as err:
        _fail(str(err))
    try:
        out = _epsilon(args, sampler) if args.command == "epsilon" else _noise(args, sampler)
    except ConfigError as err:
        _fail(f"{args.mechanism} mechanism with {args.sampling} sampling: {err}")
    print(json_text(out) if args.json else _human(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
