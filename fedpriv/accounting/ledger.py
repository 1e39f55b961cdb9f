"""The persisted record of privacy spent by a training run (``privacy.json`` + checkpoint state).

The ledger holds no privacy formula: after ``n`` recorded rounds its ε is
``compute_epsilon(mechanism.dp_event(sampler, n), δ, accountant, mechanism.neighboring_relation(sampler))``.
It assumes every round used the same mechanism, noise multiplier and sampler (the ones it was
built with); it checks the mechanism's σ on every query and refuses to account a changed one.

JSON convention for a non-private run (σ = 0, ε = ∞): ``"epsilon": null`` together with
``"non_private": true``. ``non_private`` is always present (``false`` otherwise), so the file is
always strict JSON (no bare ``Infinity``). A run whose *optimizer* reads noiseless statistics
(``non_private_reason``) is non-private however much noise the mechanism adds: the ledger then
reports ε = ∞ everywhere (:meth:`PrivacyLedger.reported_epsilon`) and keeps the mechanism's
accounted ε only as a labelled field and for the budget gate.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Protocol

import dp_accounting

import fedpriv.accounting.monte_carlo as monte_carlo
from fedpriv.accounting.accountant import (PLD, PLD_VALUE_DISCRETIZATION, RDP, SelfComposition,
                                           check_accountant, check_delta, check_epsilon, compute_epsilon,
                                           is_non_private, relation_name)
from fedpriv.accounting.monte_carlo import MC, MonteCarloDpEvent, MonteCarloSettings
from fedpriv.errors import ConfigError, PrivacyBudgetExceeded
from fedpriv.sampling import Sampler

LEDGER_FORMAT = 1
PRIVACY_FILE = "privacy.json"
BUDGET_SLACK = 1e-9  # relative slack when comparing spent ε with the target
MC_PREFIX_CHECKPOINTS = 8  # Monte-Carlo accounting: ε is claimed at this many prefixes of the planned run


class AccountedMechanism(Protocol):
    """What the ledger and calibration need from a noise mechanism: it states its own DpEvent —
    at its σ, or at the σ it would have if built with ``noise_multiplier`` — and relation (the
    accounting part of :class:`fedpriv.mechanisms.base.NoiseMechanism`)."""

    name: str
    noise_multiplier: float

    def dp_event(self, sampler: Sampler, rounds: int,
                 noise_multiplier: float | None = None) -> dp_accounting.DpEvent: ...

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation: ...

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict[str, Any]: ...


def prefix_checkpoints(planned_rounds: int) -> list[int]:
    """The round counts at which the Monte-Carlo accountant claims ε in a run of ``planned_rounds``."""
    return sorted({math.ceil(planned_rounds * i / MC_PREFIX_CHECKPOINTS) for i in range(1, MC_PREFIX_CHECKPOINTS + 1)})


def prefix_claim_settings(settings: MonteCarloSettings, planned_rounds: int | None) -> MonteCarloSettings:
    """``settings`` for a run's Monte-Carlo claims: the reported ε is the smallest of the prefix
    checkpoints' claims, so γ is split over them (union bound; a calibration that must agree with
    the ledger uses the same settings)."""
    return settings.shared(len(prefix_checkpoints(planned_rounds))) if planned_rounds else settings


def json_epsilon(epsilon: float) -> float | None:
    """ε for JSON: ``None`` (null) when infinite, see the module docstring."""
    return None if math.isinf(epsilon) else float(epsilon)


def sampling_dict(sampler: Sampler, with_data_count: bool = True) -> dict[str, Any]:
    """privacy.json's ``sampling``; for the Poisson-type samplers also what fixed the rate.

    ``with_data_count=False`` leaves out ``population``, the data's own unit count: what a release
    under add/remove-one writes, since neighbours there differ in that count (only the public
    population, which fixed the rate, is written)."""
    out = {"kind": sampler.kind, "rate": float(sampler.rate),
           **({"population": int(sampler.population)} if with_data_count else {}),
           "expected_cohort": float(sampler.expected_cohort)}
    if hasattr(sampler, "bins"):
        out["bins"] = int(sampler.bins)
    if getattr(sampler, "rate_from_data", False):
        out["rate_fixed_by"] = ("the dataset's own count (no public population was configured): neighbours keep "
                                "the population size, so the relation is zero-out")
    elif sampler.public_population is not None:
        out["public_population"] = int(sampler.public_population)
        out["rate_fixed_by"] = ("the public population size in the config: adding or removing a user changes no "
                                "other user's participation")
    return out


def _check_round_count(rounds: int | None, what: str) -> int | None:
    if rounds is None:
        return None
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ConfigError(f"{what} must be an integer >= 0, got {rounds!r}")
    return rounds


class PrivacyLedger:
    """ε spent so far by ``mechanism`` under ``sampler``, at fixed ``delta``, with a budget check."""

    @property
    def releases_data_count(self) -> bool:
        """Whether a release may state the data's own unit count: only where neighbouring datasets
        share it (zero-out, replace-one). Under add/remove-one they differ in it, so the count is
        private and only the config's public population is written."""
        return self.relation != dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    @property
    def averaged_noise_to_clip(self) -> float:
        """σ / m̄: the standard deviation of the noise on each coordinate of the averaged update
        (the noised sum divided by the expected cohort m̄), in units of the clip bound. Exact for
        independent noise; a correlated mechanism's per-round noise differs (its prefix sums carry
        less), so there it is the scale of the noise one round would get alone."""
        return self.noise_multiplier / float(self.sampler.expected_cohort)

    @property
    def averaged_noise_norm_to_clip(self) -> float | None:
        """σ·√d / m̄: the expected norm of that noise over the update's d coordinates, in units of
        the clip bound — the largest norm the average of clipped updates can have (None: d not
        given)."""
        return None if self.dimension is None else self.averaged_noise_to_clip * math.sqrt(self.dimension)

    def __init__(self, mechanism: AccountedMechanism, sampler: Sampler, delta: float,
                 accountant: str = RDP, target_epsilon: float | None = None,
                 planned_rounds: int | None = None, non_private_reason: str | None = None,
                 randomness: dict[str, Any] | None = None, query: dict[str, Any] | None = None,
                 audit: dict[str, Any] | None = None, plan: dict[str, Any] | None = None,
                 dimension: int | None = None,
                 monte_carlo_settings: MonteCarloSettings | None = None, preview: bool = False) -> None:
        self.mechanism = mechanism
        # a plan's preview (python -m fedpriv.plan, a sweep's checks), never a run's release: its Monte-Carlo
        # claims may come from the cache (monte_carlo.claim); a ledger bound to a run's parts drops them
        self.preview = preview
        self.dimension = dimension  # coordinates of the noised update (the trained parameters)
        self.sampler = sampler
        self.delta = check_delta(delta)
        self.accountant = check_accountant(accountant)
        self.target_epsilon = None if target_epsilon is None else check_epsilon(target_epsilon)
        self.planned_rounds = _check_round_count(planned_rounds, "planned rounds")
        self.noise_multiplier = float(mechanism.noise_multiplier)
        self.relation = mechanism.neighboring_relation(sampler)
        self.non_private_reason = non_private_reason
        self.randomness = randomness  # how the run's randomness was made (privacy.json says so)
        self.query = query  # the joint query the mechanism privatizes, when not the sum alone (adaptive clipping)
        self.audit = audit  # an audited run's label (canaries in every release from round 1)
        self.plan = plan  # what plan=auto chose from public quantities (no data: post-processing of nothing private)
        self._round_indices: list[int] = []
        self._cache: dict[int, float] = {0: 0.0}
        self._compositions: dict[str, SelfComposition] = {}
        self.monte_carlo = (prefix_claim_settings(monte_carlo_settings or MonteCarloSettings(), self.planned_rounds)
                            if accountant == MC else None)
        self._claims: dict[int, dict[str, Any]] = {}  # Monte Carlo: prefix checkpoint -> its claim
        self.epsilon(1)  # fail closed now if this mechanism/sampler/accountant cannot be accounted

    # ------------------------------------------------------------ accounting

    @property
    def rounds_done(self) -> int:
        return len(self._round_indices)

    @property
    def round_indices(self) -> tuple[int, ...]:
        return tuple(self._round_indices)

    def dp_event(self, rounds: int | None = None) -> dp_accounting.DpEvent:
        """The mechanism's event for ``rounds`` rounds (default: the rounds recorded so far)."""
        return self.mechanism.dp_event(self.sampler, self._rounds(rounds))

    def epsilon(self, rounds: int | None = None) -> float:
        """ε after ``rounds`` rounds (default: rounds recorded); cached per round count."""
        n = self._rounds(rounds)
        self._check_mechanism_unchanged()
        if n not in self._cache:
            try:
                self._cache[n] = self._epsilon(n)
            except ConfigError as err:
                raise ConfigError(f"{self.mechanism.name} mechanism with {self.sampler.kind} "
                                  f"sampling: {err}") from err
        return self._cache[n]

    def _epsilon(self, n: int) -> float:
        """The Monte-Carlo accountant claims ε at a few prefixes of the planned run
        (:meth:`_claim`); other self-composed events go through their :class:`SelfComposition`;
        the rest are computed directly.

        A self-composed event (every round the same event: the amplified mechanisms) goes
        through its :class:`SelfComposition`, so round n costs one round; other events (a Gaussian
        of total sensitivity, the single-epoch tree) are closed forms and computed directly."""
        event = self.mechanism.dp_event(self.sampler, n)
        if isinstance(event, MonteCarloDpEvent) and self.monte_carlo is not None:
            return self._covering_claim(n)["epsilon"]
        if isinstance(event, dp_accounting.SelfComposedDpEvent) and not is_non_private(event):
            key = repr(event.event)
            if key not in self._compositions:
                self._compositions[key] = SelfComposition(event.event, self.delta, self.accountant, self.relation)
            return self._compositions[key].epsilon(event.count)
        return compute_epsilon(event, self.delta, self.accountant, self.relation)

    def _covering_claim(self, n: int) -> dict[str, Any]:
        """The Monte-Carlo claim reported for ``n`` rounds: the smallest of the claims of every
        prefix checkpoint ≥ n (a release of n rounds is a post-processing of any longer one, so each
        of them bounds its ε; the confidence is split over the checkpoints, :func:`prefix_claim_settings`,
        so the smallest holds at the stated confidence). Taking the smallest over all longer
        prefixes makes the reported ε non-decreasing in n although each claim has its own samples.
        Beyond the planned rounds no checkpoint covers n, and a claim made there would fall outside
        the union bound: refused (a run never goes past its plan). Without a plan (the API only:
        every run has one) the claim for n itself, each such claim at the stated confidence on its
        own, not jointly."""
        planned = self.planned_rounds
        if planned and n > planned:
            raise ValueError(f"the Monte-Carlo claims cover the planned {planned} rounds, not {n}: the confidence "
                             "is split over the plan's prefix checkpoints")
        if not planned:
            return self._claim(n)
        return min((self._claim(c) for c in prefix_checkpoints(planned) if c >= n), key=lambda claim: claim["epsilon"])

    def _claim(self, n: int) -> dict[str, Any]:
        """The Monte-Carlo claim for ``n`` rounds: ε (the bound) and its point estimate, and δ
        at that ε, estimate and bound (cached: each prefix is sampled once per run)."""
        if n not in self._claims:
            assert self.monte_carlo is not None
            event = self.mechanism.dp_event(self.sampler, n)
            made = monte_carlo.claim(event, self.delta, self.monte_carlo, cached=self.preview)
            self._claims[n] = {"rounds": n, **made, "confidence": self.monte_carlo.confidence}
        return self._claims[n]

    def reported_epsilon(self, rounds: int | None = None) -> float:
        """The ε every output reports: ∞ when the run is non-private for any reason (σ = 0, or an
        optimizer that reads noiseless statistics), else :meth:`epsilon`."""
        eps = self.epsilon(rounds)
        return math.inf if self.non_private_reason else eps

    def check_can_run(self, rounds_done_after: int) -> float:
        """Raise ``PrivacyBudgetExceeded`` if ε after ``rounds_done_after`` rounds would exceed the target.

        Call it *before* releasing a round (with ``rounds_done + 1``), or once at start with the
        planned rounds. Returns that ε. Without a target it only computes ε.
        """
        eps = self.epsilon(rounds_done_after)
        if self.target_epsilon is not None and eps > self.target_epsilon * (1.0 + BUDGET_SLACK):
            raise PrivacyBudgetExceeded(
                f"{rounds_done_after} rounds would spend epsilon={eps:.6g} > target "
                f"{self.target_epsilon:g} at delta={self.delta:g} ({self.accountant} accountant)")
        return eps

    def record_round(self, round_idx: int) -> float:
        """Record that round ``round_idx`` was released; returns ε so far.

        Records unconditionally (the ledger must never under-report what was released); the budget
        gate is :meth:`check_can_run`. Round indices must be non-negative and strictly increasing.
        """
        if isinstance(round_idx, bool) or not isinstance(round_idx, int) or round_idx < 0:
            raise ValueError(f"round index must be an integer >= 0, got {round_idx!r}")
        if self._round_indices and round_idx <= self._round_indices[-1]:
            raise ValueError(f"round {round_idx} recorded after round {self._round_indices[-1]}; "
                             "rounds must be recorded once each, in increasing order")
        self._round_indices.append(round_idx)
        return self.epsilon()

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (privacy.json). ε = ∞ is written as null + ``non_private: true``."""
        eps = self.reported_epsilon()
        planned = None if self.planned_rounds is None else json_epsilon(self.reported_epsilon(self.planned_rounds))
        extra: dict[str, Any] = {}
        if self.non_private_reason:
            extra = {"non_private_reason": self.non_private_reason,
                     "accounted_epsilon_of_the_noised_update_only": json_epsilon(self.epsilon())}
        if self.randomness is not None:
            extra["randomness"] = self.randomness
        if self.query is not None:
            extra["clipping"] = self.query
        if self.audit is not None:
            extra["audit"] = self.audit
        if self.plan is not None:
            extra["plan"] = self.plan
        if self.monte_carlo is not None and self.rounds_done and not is_non_private(self.dp_event()):
            claim = dict(self._covering_claim(self.rounds_done))  # the claim behind the ε reported
            claim["epsilon"] = json_epsilon(claim["epsilon"])
            claim["epsilon_estimate"] = json_epsilon(claim["epsilon_estimate"])
            extra["monte_carlo_claim"] = claim
        return {
            "epsilon": json_epsilon(eps),
            "non_private": math.isinf(eps),
            "delta": self.delta,
            "accountant": self.accountant,
            "accountant_settings": self._accountant_settings(),
            "neighboring_relation": relation_name(self.relation),
            "mechanism": self.mechanism.name,
            "noise_multiplier": self.noise_multiplier,
            "averaged_noise_to_clip": self.averaged_noise_to_clip,
            "averaged_noise_norm_to_clip": self.averaged_noise_norm_to_clip,
            "sampling": sampling_dict(self.sampler, with_data_count=self.releases_data_count),
            "rounds": self.rounds_done,
            "last_round": self._round_indices[-1] if self._round_indices else None,
            "planned_rounds": self.planned_rounds,
            "planned_epsilon": planned,
            "target_epsilon": self.target_epsilon,
            "events": [repr(self.dp_event())],
            **self.mechanism.accounting_details(self.sampler, self.rounds_done),
            **extra,
        }

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: the configuration (checked on load) and the recorded round indices."""
        return {"format": LEDGER_FORMAT, "config": self._config(),
                "round_indices": list(self._round_indices)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore recorded rounds; the checkpoint's privacy configuration must equal this one's."""
        if state.get("format") != LEDGER_FORMAT:
            raise ConfigError(f"privacy ledger checkpoint format {state.get('format')!r} is not {LEDGER_FORMAT}")
        mine, theirs = self._config(), state.get("config", {})
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if diff:
            raise ConfigError("privacy ledger checkpoint was written with a different privacy "
                              f"configuration (differs in: {', '.join(diff)})")
        indices = [int(i) for i in state["round_indices"]]
        if any(b <= a for a, b in zip(indices, indices[1:])) or any(i < 0 for i in indices):
            raise ConfigError("privacy ledger checkpoint has invalid round indices")
        self._round_indices = indices

    def bind(self, mechanism: AccountedMechanism, sampler: Sampler,
             randomness: dict[str, Any] | None) -> "PrivacyLedger":
        """This ledger of a planned run (no round recorded; built on a key-less mechanism and
        sampler, :mod:`fedpriv.plan`) for the run's own keyed ones, keeping the ε it has computed
        (each Monte-Carlo prefix is sampled once per run); ``randomness``: how the run's
        randomness was made. Refused (``ConfigError``) unless they account exactly as the planned
        ones: the same σ, neighbouring relation and DpEvent of the planned rounds."""
        if self.rounds_done:
            raise ValueError("only a planned ledger (no round recorded) can be bound to a run's mechanism")
        n = self.planned_rounds or 1
        if (float(mechanism.noise_multiplier) != self.noise_multiplier
                or mechanism.neighboring_relation(sampler) != self.relation
                or repr(mechanism.dp_event(sampler, n)) != repr(self.dp_event(n))):
            raise ConfigError(f"the run's {mechanism.name} mechanism and {sampler.kind} sampler do not account as "
                              "the planned ones: refusing to run on another plan's ledger")
        bound = copy.copy(self)
        bound.mechanism, bound.sampler, bound.randomness = mechanism, sampler, randomness
        bound._round_indices = []
        bound._cache, bound._claims = dict(self._cache), dict(self._claims)
        if self.preview and self.monte_carlo is not None:  # a release never reports a claim read from the cache
            bound.preview, bound._claims = False, {}
            bound._cache = {0: 0.0}
        bound._compositions = dict(self._compositions)
        return bound

    # ------------------------------------------------------------ helpers

    def _rounds(self, rounds: int | None) -> int:
        n = self.rounds_done if rounds is None else _check_round_count(rounds, "rounds")
        assert n is not None
        return n

    def _check_mechanism_unchanged(self) -> None:
        if float(self.mechanism.noise_multiplier) != self.noise_multiplier:
            raise ConfigError(
                f"{self.mechanism.name} mechanism noise multiplier changed from {self.noise_multiplier} "
                f"to {self.mechanism.noise_multiplier} after the privacy ledger was created")

    def _accountant_settings(self) -> dict[str, Any]:
        if self.monte_carlo is not None:
            return self.monte_carlo.describe(self.delta)
        if self.accountant == PLD:
            return {"value_discretization_interval": PLD_VALUE_DISCRETIZATION}
        return {"rdp_orders": "dp_accounting default (1.1..10.9, 11..63, 128, 256, 512, 1024)"}

    def _config(self) -> dict[str, Any]:
        config = {"mechanism": self.mechanism.name, "noise_multiplier": self.noise_multiplier,
                  "sampling": sampling_dict(self.sampler), "delta": self.delta,
                  "accountant": self.accountant, "neighboring_relation": relation_name(self.relation),
                  "target_epsilon": self.target_epsilon, "planned_rounds": self.planned_rounds}
        if self.monte_carlo is not None:
            config["monte_carlo"] = self.monte_carlo.describe(self.delta)
        return config
