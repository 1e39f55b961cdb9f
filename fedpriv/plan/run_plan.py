"""A run's plan: everything its configuration and its data's population decide, fixed before the
run directory is locked and before any key is drawn.

:func:`build_plan` turns the parsed config and the loaded task into a frozen :class:`RunPlan`:
the config fitted to the population, the sampler and the mechanism the accounting assumes, σ (given
or calibrated to the target ε over the mechanism's own DpEvent), the ledger of the planned rounds
(the budget checked, ε of every round cached), the server optimizer's and the clip rule's checks,
Book-Keeping's support of the model wherever the run clips per sample, and the files the run will
write. It writes no file of the run and draws no secret (its sampler and mechanism have no key and
no noise stream: they only state their accounting), so the same builder is the pre-flight of a run
(:func:`fedpriv.runner.prepare` builds it before it locks the run directory) and of every member of
a sweep (:func:`preflight_sweep`). Every refusal that needs the data is raised here.

A BandMF/BLT strategy is optimised (or read from the strategy cache, outside the run directory)
while planning; a resumed run plans again on its checkpoint's strategy (``adopt``), never on a new one.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedpriv.accounting import PrivacyLedger, calibrate_noise_multiplier
from fedpriv.accounting.ledger import prefix_claim_settings
from fedpriv.accounting.monte_carlo import MonteCarloSettings
from fedpriv.round.adaptive_clipping import build_adaptive_clip
from fedpriv.audit.canaries import CanarySet
from fedpriv.audit.run import audit_label, build_canaries
from fedpriv.config.resolve import run_config, validate_against_data
from fedpriv.errors import ConfigError
from fedpriv.mechanisms import Mechanism
from fedpriv.release.observe import check_observability
from fedpriv.optim.server import SGDOptimizer
from fedpriv.plan.auto import accounting_part
from fedpriv.plan.noise_figure import NoiseFigure, noise_figure
from fedpriv.release.run_outputs import planned_outputs
from fedpriv.keys.randomness import RunRandomness
from fedpriv.sampling import Sampler, make_sampler, participations
from fedpriv.schema import GROUPS, RunConfig, as_dict
from fedpriv.sums import SumPlan, check_query, plan_sum
from fedpriv.task import Task, load_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyedParts:
    """The run's parts that hold a key of its randomness, built in one place
    (:meth:`RunPlan.instantiate`), each from its own subkey of the run key: the sampler
    (``sampling``), the mechanism's noise (``mechanism``), the audit's canaries (``audit``), the
    distributed-DP parties' rotation (``ddgauss rotation``) and the simulated dropouts
    (``dropout``). Subkeys are derived from the key and the label alone (no state), so building
    them here changes no draw."""

    sampler: Sampler
    mechanism: Mechanism
    canaries: CanarySet | None
    rotation_key: bytes  # read only where the parties add the noise (fedpriv.sums)
    dropout_key: bytes  # client.dropout_rate's draws in backend=local (secret in secure mode)


@dataclass(frozen=True)
class RunPlan:
    """What a run will do, decided from its config and its data's population alone (no key, no file).

    ``spec``: the resolved config fitted to the population (config.yaml holds its plain form);
    ``population``: the units the accounting's rates are computed over; ``noise_multiplier``: σ,
    ``calibrated`` when it was solved for the target ε; ``mechanism_clip``: the sensitivity the
    mechanism adds noise for (1 under adaptive clipping, which normalises each round by its bound);
    ``ledger``: the accounting of the planned rounds on key-less sampler and mechanism (budget
    checked; the run's ledger is this one bound to the keyed ones, :meth:`PrivacyLedger.bind`);
    ``outputs``: the files the run writes, in the order of their first write
    (:mod:`fedpriv.release.run_outputs`); ``noise``: σ_eff, σ·√d/m̄ and the accumulated noise a
    (:mod:`fedpriv.plan.noise_figure`). Book-Keeping's support of the model is checked while
    planning wherever the backend runs a round that clips per sample on the server's side (the
    clients' engines are checked when the task is loaded)."""

    spec: RunConfig
    task: Task  # the task of the executed config (cached per process: fedpriv.task.load_task)
    population: int
    noise_multiplier: float
    calibrated: bool
    mechanism_clip: float
    ledger: PrivacyLedger
    outputs: tuple[str, ...]
    choice: dict | None  # what plan=auto chose, with its prediction (privacy.json and summary.json `plan`)
    noise: NoiseFigure  # the noise the run's step carries into the model (fedpriv.plan.noise_figure)
    # the sum protocol's plan (fedpriv.sums.plan_sum: who adds the noise, SecAgg+'s sizes and field); the server's
    # dispatch and every node read it (a node plans it itself from the config and refuses a server that differs)
    sums: SumPlan

    def instantiate(self, randomness: RunRandomness) -> KeyedParts:
        """The keyed parts of this plan under the run's ``randomness``: the planned sampler and
        mechanism again, now with their keys (the plan's own have none: they only state their
        accounting), the canaries over the planned dimension, and the round's keys."""
        spec = self.spec
        sampler = make_sampler(spec.sampling, self.population, spec.cohort_size, randomness.subkey("sampling"),
                               groups=spec.mechanism.sampling_groups(), public_population=spec.population)
        mechanism = spec.mechanism.build(self.noise_multiplier, self.mechanism_clip,
                                         noise=randomness.noise("mechanism"), rounds=spec.rounds, sampler=sampler,
                                         dimension=self.ledger.dimension)
        canaries = build_canaries(spec.audit, spec.privacy.clip_norm, self.ledger.dimension, sampler, randomness)
        return KeyedParts(sampler, mechanism, canaries, randomness.subkey("ddgauss rotation"),
                          randomness.subkey("dropout"))

    @property
    def planned_epsilon(self) -> float:
        """ε the run reports after its planned rounds (∞ when it is not private)."""
        return self.ledger.reported_epsilon(self.spec.rounds)

    def describe(self) -> dict:
        """The plan in plain values (what a pre-flight prints; no key, no private count)."""
        ledger = self.ledger
        return {"mechanism": ledger.mechanism.name, "sampling": ledger.sampler.kind,
                "accountant": ledger.accountant, "noise_multiplier": self.noise_multiplier,
                "calibrated": self.calibrated, "rounds": self.spec.rounds, "cohort_size": self.spec.cohort_size,
                "planned_epsilon": self.planned_epsilon, "delta": ledger.delta,
                "averaged_noise_to_clip": ledger.averaged_noise_to_clip,
                "participations": dict(zip(("expected_per_unit", "cap_per_unit"),
                                           participations(ledger.sampler, self.spec.rounds))),
                "algorithm": self.spec.algorithm.name, "noise": self.noise.describe(), "outputs": list(self.outputs)}


def build_plan(spec: RunConfig, task: Task, adopt: Callable[[Mechanism], None] | None = None,
               preview: bool = False) -> RunPlan:
    """The plan of the parsed ``spec`` on ``task``'s data (``ConfigError`` /
    ``PrivacyBudgetExceeded`` on every refusal). ``adopt``: given a key-less mechanism, makes it
    take a resumed run's strategy from its checkpoint before σ is calibrated on it. ``preview``: a
    plan nothing is released from (:func:`preflight`): its ledger's Monte-Carlo claims may be read
    from the cache (:func:`fedpriv.accounting.monte_carlo.claim`)."""
    population = len(task.units)
    spec, choice = _apply_plan(spec, task)
    spec = fit_to_population(spec, population)
    task = load_task(spec)  # the executed config's (clients' example-level DP is set for its rounds)
    validate_against_data(spec, population, task.algorithm.privacy_unit)
    if spec.backend.batched_rounds:  # its one-pass / central round clips per sample: refused before any write
        task.algorithm.check_model(task.client_model, spec.model.per_sample_alternative(), batched=True)
    privacy = spec.privacy
    sampler = make_sampler(spec.sampling, population, spec.cohort_size, None,
                           groups=spec.mechanism.sampling_groups(), public_population=spec.population)
    # adaptive clipping normalises each round by C_t: the mechanism then runs at unit sensitivity
    mechanism_clip = 1.0 if privacy.clipping == "adaptive" else privacy.clip_norm
    dimension = task.initial_params.numel()
    accounting = spec.mechanism.build(1.0, mechanism_clip, rounds=spec.rounds, sampler=sampler, dimension=dimension)
    if adopt is not None:
        adopt(accounting)
    sigma = _noise_multiplier(spec, accounting, sampler)
    mechanism = spec.mechanism.build(sigma, mechanism_clip, rounds=spec.rounds, sampler=sampler, dimension=dimension)
    if adopt is not None:
        adopt(mechanism)
    optimizer = spec.optimizer.build(spec.rounds)  # its checks only: the run builds its own (it holds state)
    optimizer.query_plan.check(spec.optimizer.name, mechanism, task.algorithm.per_unit_deltas)
    # the sum protocol: its sizes and the run's fixed grid, refused before any write
    sums = plan_sum(spec, mechanism, dimension, sampler.expected_cohort)
    check_query(sums, optimizer.query_plan, spec.optimizer.name, mechanism.name)
    clip = build_adaptive_clip(privacy, sigma, sampler.expected_cohort,
                               squares=optimizer.query_plan.squares, optimizer=spec.optimizer.name)
    reasons = [r for r in (getattr(optimizer, "non_private_reason", None), task.data.info.get("non_private_reason"))
               if r]
    target = privacy.target_epsilon if privacy.noise_multiplier is None else None
    ledger = PrivacyLedger(mechanism, sampler, privacy.delta, privacy.accountant, target_epsilon=target,
                           planned_rounds=spec.rounds, non_private_reason="; ".join(reasons) or None,
                           query=None if clip is None else clip.describe(), audit=audit_label(spec.audit),
                           plan=accounting_part(choice), dimension=dimension,
                           monte_carlo_settings=_monte_carlo_settings(spec), preview=preview)
    ledger.check_can_run(spec.rounds)
    check_observability(spec)
    noise = noise_figure(mechanism, sigma, spec.rounds, sampler.expected_cohort, ledger.dimension, privacy.clip_norm,
                         server_step(spec))
    return RunPlan(spec=spec, task=task, population=population, noise_multiplier=sigma,
                   calibrated=privacy.noise_multiplier is None, mechanism_clip=mechanism_clip, ledger=ledger,
                   outputs=planned_outputs(spec, client_dp=task.local.dp is not None), choice=choice,
                   noise=noise, sums=sums)


def server_step(spec: RunConfig) -> tuple[float, float] | None:
    """The server optimizer's learning rate (as the cosine schedule's peak that accumulates the same
    noise) and momentum when it is a (heavy-ball) SGD step on the privatized average, whose
    accumulated noise :mod:`fedpriv.plan.noise_figure` states; None for another optimizer (an
    adaptive one rescales its step per coordinate)."""
    optimizer = spec.optimizer
    if not isinstance(optimizer, SGDOptimizer):
        return None
    # the figure's η is the cosine schedule's peak: a constant rate η carries √(8/3) times its noise
    scale = 1.0 if optimizer.schedule == "cosine" else math.sqrt(8.0 / 3.0)
    return float(optimizer.lr) * scale, float(getattr(optimizer, "momentum", 0.0))


def _noise_multiplier(spec: RunConfig, mechanism: Mechanism, sampler) -> float:
    """σ: the config's, or calibrated to its target ε over the mechanism's own DpEvent."""
    privacy = spec.privacy
    if privacy.noise_multiplier is not None:
        return float(privacy.noise_multiplier)
    return calibrate_noise_multiplier(
        lambda s: mechanism.dp_event(sampler, spec.rounds, noise_multiplier=s),
        privacy.target_epsilon, privacy.delta, privacy.accountant, mechanism.neighboring_relation(sampler),
        monte_carlo_settings=prefix_claim_settings(MonteCarloSettings.of(privacy.mc), spec.rounds))


def _monte_carlo_settings(spec: RunConfig) -> MonteCarloSettings:
    """The Monte-Carlo accountant's settings for the ledger's claims: shared over the σ grid when σ
    was calibrated on it (:func:`fedpriv.accounting.monte_carlo.calibrate`), as given otherwise."""
    settings = MonteCarloSettings.of(spec.privacy.mc)
    return settings if spec.privacy.noise_multiplier is not None else settings.calibrated()


def executed_config(spec: RunConfig, task: Task) -> RunConfig:
    """The config a run of ``spec`` on ``task``'s data executes (what its config.yaml holds and its
    research key covers): the ``plan`` option applied (``plan=auto`` chooses cohort, rounds,
    mechanism, clip and server step), then the mechanism's defaults fitted to the population.
    Server and clients (a deployment's ClientApp) derive it alike."""
    return fit_to_population(_apply_plan(spec, task)[0], len(task.units))


def _apply_plan(spec: RunConfig, task: Task) -> tuple[RunConfig, dict | None]:
    """``spec.plan`` applied to the public quantities: the population if public (``population``, or
    a count the data's config fixes), the trained parameter count and the public corpus' sentence
    count (every node loads the same corpus); never the data's content."""
    public = spec.population or spec.data.public_population()
    corpus = task.data.public
    return spec.plan.apply(spec, public, task.initial_params.numel(),
                           None if corpus is None else len(corpus.sentences))


def fit_to_population(spec: RunConfig, population: int) -> RunConfig:
    """``spec`` with the mechanism's defaults fitted to the population
    (:meth:`MechanismOption.fitted`, e.g. BandMF's bands); the run says what changed."""
    population = spec.population or population  # a public population fixes the rates, as for the sampler
    fitted = spec.mechanism.fitted(population, spec.cohort_size, spec.rounds, spec.sampling)
    if fitted is spec.mechanism:
        return spec
    for name, before in dataclasses.asdict(spec.mechanism).items():
        after = getattr(fitted, name)
        if after != before:
            log.warning("mechanism.%s=%s does not fit %d rounds of cohorts of %d from %d units: using %s, "
                        "the largest that fits", name, before, spec.rounds, spec.cohort_size, population, after)
    return dataclasses.replace(spec, mechanism=fitted)


def preflight(cfg: dict, typed: Sequence[str] = ()) -> RunPlan:
    """The plan of the plain ``cfg`` without a run directory or secrets (:func:`build_plan`): what a
    sweep checks for each member before the first one starts (``ConfigError`` on a problem), and
    the settings ``typed`` on its command line that its plan option replaced (:func:`check_typed`).
    The caller's dict is left as it is; the checks' warnings are left to the run itself."""
    spec = run_config(copy.deepcopy(cfg))
    quiet = logging.getLogger("fedpriv")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        plan = build_plan(spec, load_task(spec), preview=True)
    finally:
        quiet.setLevel(level)
    check_typed(spec, plan, typed)
    return plan


_ABSENT = object()  # a key the config does not have (another option's)


def _value(plain: dict, path: str):
    for part in path.split("."):
        if not isinstance(plain, dict) or part not in plain:
            return _ABSENT
        plain = plain[part]
    return plain


def check_typed(given: RunConfig, plan: RunPlan, typed: Sequence[str]) -> None:
    """Refuse, in one line naming each, the ``key=value`` settings ``typed`` on the command line
    whose value the plan option replaced (``plan=auto`` chooses cohort, rounds, mechanism, sampler,
    accountant, clip and server step): such a setting is never dropped without a word. A typed value
    the plan keeps (the one it chose too, ``rounds=200`` where the budget gives 200 rounds) passes;
    so do the experiment's settings and ``auto`` (choose for me). ``given``: the parsed config the
    plan was applied to; a group (``mechanism=tree``) is compared by its option's name."""
    if plan.choice is None:
        return
    before, after = as_dict(given), as_dict(plan.spec)
    dropped = []
    for override in typed:
        key, sep, value = override.partition("=")
        key = key.lstrip("+")
        if not sep or key.startswith("~") or key == "experiment" or key.split(".")[0] == "plan" or value == "auto":
            continue
        path = f"{key}.name" if key in GROUPS else key
        now = _value(after, path)
        if _value(before, path) != now:
            shown = "not a key of the planned option" if now is _ABSENT else f"{now:.4g}" if isinstance(now, float) \
                else str(now)
            dropped.append(f"{key}={value} (planned: {shown})")
    if dropped:
        one = len(dropped) == 1
        what = "this setting sets" if one else "these settings set"
        raise ConfigError(f"plan={plan.spec.plan.name} chooses what {what} and chose otherwise: "
                          f"{', '.join(dropped)}; leave {'it' if one else 'them'} out (the "
                          f"plan's budget is plan.client_updates={plan.choice['client_updates']} client updates; "
                          "python -m fedpriv.plan shows the plan), or use plan=fixed with your settings")


def preflight_sweep(members: Sequence[tuple[str, dict, Sequence[str]]]) -> None:
    """:func:`preflight` for every member of a ``-m`` sweep of more than one (what needs the data:
    population, sampler and mechanism, budget), and for a single run whose command line chooses a
    plan option (the settings typed beside it, :func:`check_typed`), as ``(its overrides, its
    config, the settings typed for it)`` from :func:`fedpriv.config.compose.check_overrides`, before Hydra
    starts the first (``ConfigError``)."""
    single = len(members) < 2
    for member, plain, typed in members:
        if single and not any(o.partition("=")[0].lstrip("+") == "plan" and o.partition("=")[2] != "fixed"
                              for o in typed):
            continue  # a single run with plan=fixed: its own prepare checks it, once
        try:
            preflight(plain, typed)
        except ConfigError as err:
            if single:
                raise
            raise ConfigError(f"sweep member {member}: {err} (no member was run)") from None
