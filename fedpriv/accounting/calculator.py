"""What ``python -m fedpriv.accounting`` computes once its arguments are parsed
(:mod:`fedpriv.accounting.__main__` parses them; this module loads torch, through the samplers and
the mechanisms, so the calculator's ``--help`` does not).

The DpEvent always comes from the mechanism object, built through its registered option (so a
mechanism registered with ``fedpriv.schema.register_option`` is here too), and a sampler built by
``fedpriv.sampling.make_sampler`` (so is a kind registered with ``register_sampler``: it reads
``--population`` and ``--cohort``); this module only validates, computes through them and formats.
Bad input raises :class:`~fedpriv.errors.ConfigError` whose message is the whole error line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any, Callable

import dp_accounting

import fedpriv.accounting.monte_carlo as monte_carlo
from fedpriv.accounting.accountant import (RDP, accountant_delta, calibrate_noise_multiplier, check_delta,
                                           check_epsilon, compute_epsilon, make_accountant, relation_name)
from fedpriv.accounting.monte_carlo import MC, BallsInBinsDpEvent, MonteCarloDpEvent, MonteCarloSettings
from fedpriv.accounting.ledger import json_epsilon
from fedpriv.errors import ConfigError
from fedpriv.release.rundir import json_text
from fedpriv.schema import MechanismOption, load, option_preset, options
from fedpriv.sampling import (B_MIN_SEP, BALLS_IN_BINS, CYCLIC, CYCLIC_POISSON, FIXED_SIZE, POISSON, PUBLIC_RATE_KINDS,
                              SAMPLERS, BinsBound, ParticipationBound, ParticipationPattern, PoissonSampler, Sampler,
                              make_sampler)


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


def sampling_kinds() -> list[str]:
    """The registered sampler kinds (``fedpriv.sampling.register_sampler``), in registration order."""
    return list(SAMPLERS)


def _ddgauss(args: argparse.Namespace) -> dict[str, Any]:
    """The plan of :func:`fedpriv.accounting.ddgauss.plan_ddgauss`, beside the central Gaussian's
    noise multiplier at the same epsilon (RDP, Poisson sampling) for comparison."""
    from fedpriv.accounting.ddgauss import MAX_BITS, plan_ddgauss, tau  # lazy: only this subcommand reads it

    check_delta(args.delta)
    check_epsilon(args.target_epsilon)
    for name, value in (("rounds", args.rounds), ("shares", args.shares), ("dim", args.dim)):
        if value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}")
    if not 2 <= args.bits <= MAX_BITS:
        raise ConfigError(f"--bits must be in [2, {MAX_BITS}] (the secure sum's field is 2^bits), got {args.bits}")
    if not 0 < args.sampling_rate <= 1 or not args.clip > 0 or not args.k > 0:
        raise ConfigError(f"need 0 < --sampling-rate <= 1, --clip > 0 and --k > 0 (got {args.sampling_rate}, "
                          f"{args.clip}, {args.k})")
    try:
        plan = plan_ddgauss(args.target_epsilon, args.delta, args.clip, args.shares, args.dim, args.rounds,
                            args.sampling_rate, args.bits, args.k)
    except (ValueError, RuntimeError) as err:
        raise ConfigError(str(err)) from None
    central = calibrate_noise_multiplier(
        lambda z: dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(args.sampling_rate, dp_accounting.GaussianDpEvent(z)), args.rounds),
        args.target_epsilon, args.delta)
    summed = math.sqrt(plan.shares) * plan.local_std / plan.clip
    return {"mechanism": "ddgauss", "epsilon": plan.epsilon(args.delta, args.rounds, args.sampling_rate),
            "target_epsilon": args.target_epsilon, "delta": args.delta, "accountant": "rdp (Zhu-Wang amplification)",
            "bits": args.bits, "padded_dim": plan.dim, "granularity": plan.granularity, "local_std": plan.local_std,
            "shares": plan.shares, "summed_noise_multiplier": summed, "central_noise_multiplier": central,
            "noise_over_central": summed / central,
            "sensitivity_inflation": plan.l2_sensitivity * plan.granularity / plan.clip,
            "tau": tau(plan.shares, plan.local_std / plan.granularity)}


# the flags each sampling reads (beside --rounds, the mechanism's and the accountant's): any other
# one given is refused, never ignored; a kind not named here reads REGISTRY_FLAGS (see _registry_args)
SAMPLING_FLAGS = {POISSON: ("sampling_rate", "population"), FIXED_SIZE: ("sampling_rate", "population"),
                  CYCLIC: ("population", "cohort", "participations", "min_separation"),
                  CYCLIC_POISSON: ("population", "cohort"), B_MIN_SEP: ("population", "cohort"),
                  BALLS_IN_BINS: ("bins", "population")}
REGISTRY_FLAGS = ("population", "cohort")
MC_FLAGS = ("mc_samples", "confidence", "mc_seed")


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _check_flags_apply(args: argparse.Namespace) -> None:
    """Refuse a flag that the chosen sampling or accountant would not read."""
    reads = SAMPLING_FLAGS.get(args.sampling, REGISTRY_FLAGS)
    for name in ("sampling_rate", "population", "cohort", "participations", "min_separation", "bins"):
        if getattr(args, name) is not None and name not in reads:
            raise ConfigError(f"{_flag(name)} does not apply to --sampling {args.sampling} (it reads "
                              f"{', '.join(_flag(f) for f in reads)})")
    for name in MC_FLAGS:
        if getattr(args, name) is not None and args.accountant != MC:
            raise ConfigError(f"{_flag(name)} applies to the Monte-Carlo accountant only (--accountant mc), "
                              f"not {args.accountant}")
    if args.sampling == BALLS_IN_BINS and args.population is not None and args.bins > args.population:
        raise ConfigError(f"--bins {args.bins} exceeds --population {args.population}: every user is in one bin, "
                          f"so at most {args.population} bins can hold a user (a run makes population // cohort)")


def _validate(args: argparse.Namespace) -> None:
    if args.command == "delta":
        args.delta = None
        check_epsilon(args.epsilon, "epsilon")
    else:
        check_delta(args.delta)
    if args.accountant is None:
        args.accountant = MC if args.sampling in (BALLS_IN_BINS, B_MIN_SEP) else RDP
    if args.sampling == BALLS_IN_BINS and args.bins is None:
        raise ConfigError("--sampling balls_in_bins needs --bins")
    if args.bins is not None and args.sampling != BALLS_IN_BINS:
        raise ConfigError("--bins applies to --sampling balls_in_bins only")
    if args.bins is not None and args.bins < 1:
        raise ConfigError(f"--bins must be >= 1, got {args.bins}")
    if args.strategy_column is not None and (args.sampling != BALLS_IN_BINS or args.mechanism != "bandmf"):
        raise ConfigError("--strategy-column applies to --mechanism bandmf with --sampling balls_in_bins")
    if args.strategy_column is not None and args.bands is None:
        args.bands = len(strategy_column(args.strategy_column))  # the column's bands (the option needs them)
    defaults = MonteCarloSettings()
    args.mc = MonteCarloSettings(args.mc_samples, defaults.confidence if args.confidence is None else args.confidence,
                                 defaults.seed if args.mc_seed is None else args.mc_seed)
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
    if args.command != "noise" and not (math.isfinite(args.noise_multiplier) and args.noise_multiplier >= 0):
        raise ConfigError(f"noise multiplier must be a finite number >= 0, got {args.noise_multiplier}")
    if args.command == "noise":
        check_epsilon(args.target_epsilon)
    _check_flags_apply(args)


# (population, cohort_size, groups, public_population): the arguments of fedpriv.sampling.make_sampler
RegistryArgs = tuple[int, int, "int | None", "int | None"]


def _registry_args(kind: str, args: argparse.Namespace) -> RegistryArgs:
    """Any kind (a plugin's too): ``--population`` and ``--cohort``, the groups the mechanism's
    option declares; the population is the public one where it fixes the kind's rate."""
    if args.population is None or args.cohort is None:
        raise ConfigError(f"--sampling {kind} needs --population and --cohort")
    public = args.population if kind in PUBLIC_RATE_KINDS else None
    return args.population, args.cohort, mechanism_option(args).sampling_groups(), public


def _fixed_args(kind: str, args: argparse.Namespace) -> RegistryArgs:
    if args.population is None:
        raise ConfigError("--sampling fixed needs --population (cohort = round(q * N))")
    cohort = round(args.sampling_rate * args.population)
    if not 1 <= cohort <= args.population:
        raise ConfigError(f"fixed-size cohort round({args.sampling_rate} * {args.population}) = {cohort} is not in "
                          f"[1, {args.population}]")
    return args.population, cohort, None, None


def _cyclic_args(kind: str, args: argparse.Namespace) -> RegistryArgs | ParticipationBound:
    """With ``--population`` and ``--cohort``: the cyclic sampler; else the bound on participations."""
    if args.population is not None and args.cohort is not None:
        if args.cohort > args.population:
            raise ConfigError(f"--cohort {args.cohort} exceeds --population {args.population}")
        return args.population, args.cohort, None, None
    k = args.participations or 1
    if k > 1 and args.min_separation is None:
        raise ConfigError("--participations > 1 needs --min-separation (or --population and --cohort)")
    return ParticipationBound(participations=k, min_separation=args.min_separation or 0)


def _cyclic_poisson_args(kind: str, args: argparse.Namespace) -> RegistryArgs:
    groups = mechanism_option(args).sampling_groups()
    if args.population is None or args.cohort is None or groups is None:
        raise ConfigError("--sampling cyclic_poisson needs --population, --cohort and a mechanism with groups "
                          "(--bands)")
    if args.cohort * groups > args.population:
        raise ConfigError(f"--cohort x --bands = {args.cohort * groups} exceeds --population {args.population}")
    return args.population, args.cohort, groups, args.population


def _b_min_sep_args(kind: str, args: argparse.Namespace) -> RegistryArgs:
    if args.population is None or args.cohort is None or args.bands is None:
        raise ConfigError("--sampling b_min_sep needs --population, --cohort and --bands (the separation)")
    if args.cohort * args.bands > args.population:
        raise ConfigError(f"--cohort x --bands = {args.cohort * args.bands} exceeds --population {args.population}")
    return args.population, args.cohort, args.bands, args.population


def _poisson_rate(kind: str, args: argparse.Namespace) -> Sampler:
    # Poisson accounting depends only on q (a rate given as is, not m/N); the population is informational here.
    return PoissonSampler(population=args.population or 0, rate=args.sampling_rate)


def _bins(kind: str, args: argparse.Namespace) -> BinsBound:
    return BinsBound(bins=args.bins)


# how the calculator reads a built-in kind whose flags differ from the registry's arguments (a rate,
# bins, a bound on participations, its own messages); any other kind: _registry_args
CALCULATOR_FORMS: dict[str, Callable[[str, argparse.Namespace], "RegistryArgs | ParticipationPattern"]] = {
    POISSON: _poisson_rate, FIXED_SIZE: _fixed_args, CYCLIC: _cyclic_args, CYCLIC_POISSON: _cyclic_poisson_args,
    BALLS_IN_BINS: _bins, B_MIN_SEP: _b_min_sep_args}


def make_cli_sampler(args: argparse.Namespace) -> Sampler | ParticipationPattern:
    """The sampler the accountant must assume for ``--sampling`` (no key: a calculator never draws a
    cohort), built by the sampler registry (:func:`fedpriv.sampling.make_sampler`) from the flags; a
    rate without a population, bins and a bound on participations are patterns without a sampler."""
    form = CALCULATOR_FORMS.get(args.sampling, _registry_args)(args.sampling, args)
    if isinstance(form, ParticipationPattern):
        return form
    population, cohort, groups, public = form
    return make_sampler(args.sampling, population, cohort, None, groups=groups, public_population=public)


def strategy_column(text: str) -> tuple[float, ...]:
    """``--strategy-column``: comma-separated finite numbers (checked by the analysis's own rules)."""
    try:
        column = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--strategy-column takes comma-separated numbers, got {text!r}") from None
    if not column or not all(math.isfinite(v) for v in column):
        raise ConfigError(f"--strategy-column takes finite numbers, got {text!r}")
    return column


def _event_maker(args: argparse.Namespace, sampler) -> tuple[Any, Any, Any]:
    """(mechanism, relation, σ -> event): the mechanism's own event, or with ``--strategy-column``
    the balls-in-bins event of that column, taken as is."""
    mechanism = _build(args, 1.0, sampler)
    relation = mechanism.neighboring_relation(sampler)
    if args.strategy_column is not None:
        column = strategy_column(args.strategy_column)
        BallsInBinsDpEvent(1.0, args.rounds, args.bins, column).check()
        return mechanism, relation, lambda sigma: (dp_accounting.NonPrivateDpEvent() if sigma == 0 else
                                                   BallsInBinsDpEvent(sigma, args.rounds, args.bins, column))
    return mechanism, relation, lambda sigma: mechanism.dp_event(sampler, args.rounds, noise_multiplier=sigma)


PROGRESS_NOTICE_S = 3.0  # a Monte-Carlo computation expected to take longer says so on stderr, with its progress
PROGRESS_EVERY_S = 10.0  # ... every this many seconds
MC_BYTES_PER_SAMPLE = 48  # per sample per direction: the losses, their sorted copy and the tail sums (float64)


class Progress:
    """The cost of a Monte-Carlo computation and its progress, on stderr: once the first chunk is
    drawn, its rate gives the expected time, announced when longer than ``PROGRESS_NOTICE_S``; then
    a line every ``PROGRESS_EVERY_S``. ``total``: the samples to draw (None: a calibration, whose
    number of σ tried is not known in advance; ``per_check``: the samples of one full check)."""

    def __init__(self, what: str, total: int | None, per_check: int | None = None) -> None:
        self.what, self.total, self.per_check = what, total, per_check
        self.done, self.start, self.last, self.noticed = 0, time.monotonic(), None, False

    def __call__(self, size: int) -> None:
        self.done += size
        now = time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        if self.last is None:  # the first chunk: the estimate
            self.last = now
            rate = self.done / elapsed
            expected = (self.total or self.per_check or self.done) / rate
            if expected > PROGRESS_NOTICE_S:
                self.noticed = True
                what = (f"{self.total:,} samples, about {expected:.0f} s" if self.total else
                        f"{self.per_check:,} samples per noise multiplier checked, about {expected:.0f} s each; "
                        f"the search checks several")
                print(f"Monte Carlo ({self.what}): {what}", file=sys.stderr, flush=True)
        elif self.noticed and now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            left = f", about {(self.total - self.done) * elapsed / self.done:.0f} s left" if self.total else ""
            share = f"{100 * self.done / self.total:.0f}% " if self.total else ""
            print(f"Monte Carlo ({self.what}): {share}{self.done:,} samples in {elapsed:.0f} s{left}", file=sys.stderr,
                  flush=True)


def check_memory(samples: int) -> None:
    """Refuse, before drawing anything, a sample count whose two directions cannot fit in memory."""
    need = 2 * samples * MC_BYTES_PER_SAMPLE
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise ConfigError(f"{samples:,} Monte-Carlo samples per direction need about {need / 2**30:,.0f} GiB of memory "
                          f"(this machine has {have / 2**30:,.0f} GiB): raise delta or set --mc-samples")


def _epsilon(args: argparse.Namespace, sampler: Sampler) -> dict[str, Any]:
    mechanism, relation, make_event = _event_maker(args, sampler)
    event = make_event(args.noise_multiplier)
    out = mechanism.accounting_details(sampler, args.rounds)
    if args.accountant == MC and isinstance(event, MonteCarloDpEvent):
        monte_carlo.check_resolvable(args.delta, args.mc)
        check_memory(args.mc.count(args.delta))
        samples = monte_carlo.LossSamples(event, args.mc, args.delta,
                                          progress=Progress("epsilon", 2 * args.mc.count(args.delta)))
        eps = samples.epsilon(args.delta)
        out.update(_mc_fields(args.mc, samples.samples, eps))
        out["epsilon_estimate"] = json_epsilon(samples.epsilon(args.delta, estimate=True))
    else:
        eps = compute_epsilon(event, args.delta, args.accountant, relation)
    return _with_epsilon(out, eps, args, relation)


def _noise(args: argparse.Namespace, sampler: Sampler) -> dict[str, Any]:
    mechanism, relation, make_event = _event_maker(args, sampler)
    progress = None
    if args.accountant == MC:
        check_memory(args.mc.count(args.delta))
        progress = Progress("noise", None, per_check=2 * args.mc.count(args.delta))
    sigma = calibrate_noise_multiplier(make_event, args.target_epsilon, args.delta, args.accountant, relation,
                                       monte_carlo_settings=args.mc, progress=progress)
    settings = args.mc.calibrated()
    eps = compute_epsilon(make_event(sigma), args.delta, args.accountant, relation, monte_carlo_settings=settings)
    out = {"noise_multiplier": sigma, "target_epsilon": args.target_epsilon,
           **mechanism.accounting_details(sampler, args.rounds)}
    if args.accountant == MC:
        out.update(_mc_fields(settings, settings.count(args.delta), eps))
    return _with_epsilon(out, eps, args, relation)


def _delta(args: argparse.Namespace, sampler: Sampler) -> dict[str, Any]:
    """δ at ``--epsilon``: dp_accounting's for rdp/pld; for mc the point estimate and the bound
    (its samples: ``--mc-samples``, default 50 per unit of the smallest δ it can resolve, 1e-6)."""
    mechanism, relation, make_event = _event_maker(args, sampler)
    event = make_event(args.noise_multiplier)
    out: dict[str, Any] = {"epsilon": args.epsilon, "accountant": args.accountant,
                           "neighboring_relation": relation_name(relation),
                           **mechanism.accounting_details(sampler, args.rounds)}
    if args.noise_multiplier == 0:
        out.update({"delta": 1.0, "non_private": True})
        return out
    if args.accountant == MC:
        if not isinstance(event, MonteCarloDpEvent):
            compute_epsilon(event, 0.5, MC, relation)  # raises: says which accountant applies
        resolution = 1e-6 if args.mc.samples is None else None
        count = args.mc.count(resolution or 0.5)
        check_memory(count)
        samples = monte_carlo.LossSamples(event, args.mc, resolution or 0.5, progress=Progress("delta", 2 * count))
        bound = samples.delta(args.epsilon)
        out.update({"delta_estimate": bound.estimate, "delta_upper": bound.upper,
                    **_mc_fields(args.mc, samples.samples, None)})
        return out
    if isinstance(event, MonteCarloDpEvent):
        compute_epsilon(event, 0.5, args.accountant, relation)  # raises: balls-in-bins needs mc
    accountant = make_accountant(args.accountant, relation)
    try:
        out["delta"] = accountant_delta(accountant.compose(event), event, args.epsilon, relation)  # rdp: never 0
    except ConfigError:  # from fedpriv (an rdp vector below resolution): its own message
        raise
    except (dp_accounting.UnsupportedEventError, ValueError, NotImplementedError) as err:
        raise ConfigError(f"the {args.accountant} accountant cannot account this event ({err})") from err
    return out


def _mc_fields(settings: MonteCarloSettings, samples: int, eps: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"mc_samples_per_direction": samples, "confidence": settings.confidence,
                           "mc_seed": settings.seed, "candidates": settings.candidates}
    if eps is not None:
        out["claimed"] = "epsilon is the upper bound, holding with the stated confidence"
    return out


def _with_epsilon(out: dict[str, Any], eps: float, args: argparse.Namespace,
                  relation: dp_accounting.NeighboringRelation) -> dict[str, Any]:
    out.update({"epsilon": json_epsilon(eps), "delta": args.delta, "accountant": args.accountant,
                "neighboring_relation": relation_name(relation)})
    if math.isinf(eps):
        out["non_private"] = True
    return out


def _human(args: argparse.Namespace, out: dict[str, Any]) -> str:
    if args.command == "delta":
        value = (f"delta <= {out['delta_upper']:.6g} (estimate {out['delta_estimate']:.6g}; confidence "
                 f"{out['confidence']:g})" if "delta_upper" in out else f"delta = {out['delta']:.6g}")
        return (f"{value} at epsilon = {args.epsilon:g} ({args.accountant} accountant, {out['neighboring_relation']} "
                f"neighbouring, {args.mechanism} mechanism, noise multiplier {args.noise_multiplier:g}, "
                f"{_sampling_text(args)}, {_plural(args.rounds, 'round')})")
    eps = "inf (non-private)" if out["epsilon"] is None else f"{out['epsilon']:.6g}"
    if "epsilon_estimate" in out and out["epsilon"] is not None:
        eps += f" (upper bound at confidence {out['confidence']:g}; estimate {out['epsilon_estimate']:.6g})"
    elif "confidence" in out and out["epsilon"] is not None:
        eps += f" (upper bound at confidence {out['confidence']:g}, shared over {out['candidates']} candidates)"
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
    if args.sampling == B_MIN_SEP:
        return f"b-min-sep sampling of {args.cohort} from {args.population}, {args.bands} rounds apart"
    if args.sampling == BALLS_IN_BINS:
        of = (f" of {args.population} users ({args.population / args.bins:.4g} per round expected)"
              if args.population else "")
        return f"balls-in-bins sampling in {args.bins} bins{of}"
    if args.sampling == CYCLIC_POISSON:
        return f"cyclic Poisson sampling of {args.cohort} from {args.population} in {args.bands} groups"
    if args.sampling in (POISSON, FIXED_SIZE):
        return f"{args.sampling} sampling q = {args.sampling_rate:g}"
    if args.sampling != CYCLIC:
        return f"{args.sampling} sampling of {args.cohort} from {args.population}"
    if args.population is not None and args.cohort is not None:
        return f"cyclic sampling of {args.cohort} from {args.population}"
    return (f"at most {_plural(args.participations or 1, 'participation')}"
            + (f" >= {args.min_separation} rounds apart" if args.min_separation is not None else ""))


def result(args: argparse.Namespace) -> str:
    """What the calculator prints for the parsed ``args`` (one JSON line with ``--json``); bad input
    raises :class:`ConfigError` whose message is the whole ``error:`` line."""
    if args.command == "ddgauss":
        try:
            out = _ddgauss(args)
        except ConfigError as err:
            raise ConfigError(f"ddgauss: {err}") from None
        return json_text(out) if args.json else (
            f"ddgauss: grid step {out['granularity']:.4g}, each client's noise std {out['local_std']:.4g} "
            f"({out['bits']} bits, {out['padded_dim']} coordinates, {out['shares']} shares): epsilon = "
            f"{out['epsilon']:.4g} at delta = {out['delta']:g}; the summed noise multiplier "
            f"{out['summed_noise_multiplier']:.4f} is {out['noise_over_central']:.3f}x the central Gaussian's "
            f"{out['central_noise_multiplier']:.4f}")
    _validate(args)
    sampler = make_cli_sampler(args)
    try:
        out = {"epsilon": _epsilon, "noise": _noise, "delta": _delta}[args.command](args, sampler)
    except ConfigError as err:
        raise ConfigError(f"{args.mechanism} mechanism with {args.sampling} sampling: {err}") from None
    if args.sampling == BALLS_IN_BINS and args.population is not None:  # what --population changes: the cohort
        out.update({"population": args.population, "expected_cohort": args.population / args.bins})
    return json_text(out) if args.json else _human(args, out)
