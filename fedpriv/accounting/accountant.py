"""Interpret DpEvents with dp_accounting's accountants: epsilon for an event, noise for a target.

The accounting package never writes its own epsilon formula. A mechanism object builds the
``DpEvent`` of what it releases (``mechanism.dp_event(sampler, rounds)``); this module only hands
that event to ``dp_accounting``:

* ``"rdp"``: ``RdpAccountant`` with dp_accounting's default orders (1.1 … 10.9, 11 … 63, 128,
  256, 512, 1024) and its improved RDP → (ε, δ) conversion. At very small ε the optimum can sit on
  the largest order (1024), so the result is then a slightly loose upper bound.
* ``"pld"``: ``PLDAccountant`` with ``value_discretization_interval=1e-4`` (pessimistic
  discretisation, so still an upper bound).

Anything an accountant cannot interpret raises :class:`~fedpriv.errors.ConfigError` (fail closed):
a number is never produced for an event that was not actually accounted.
"""

from __future__ import annotations

import math
from typing import Callable

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy import optimize

from fedpriv.errors import ConfigError
from fedpriv.mechanisms.gaussian import RELATION_NAMES

RDP = "rdp"
PLD = "pld"
ACCOUNTANTS = (RDP, PLD)
PLD_VALUE_DISCRETIZATION = 1e-4
ADD_OR_REMOVE_ONE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

# Calibration search range and default relative tolerance on the noise multiplier.
MIN_NOISE_MULTIPLIER = 1e-6
MAX_NOISE_MULTIPLIER = 1e6
CALIBRATION_RTOL = 1e-4

Relation = dp_accounting.NeighboringRelation
EventMaker = Callable[[float], dp_accounting.DpEvent]


# ---------------------------------------------------------------- validation (shared with CLI)

def check_delta(delta: float) -> float:
    """δ must lie in the open interval (0, 1)."""
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    return float(delta)


def check_epsilon(epsilon: float, what: str = "target epsilon") -> float:
    """A target ε must be finite and > 0."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"{what} must be a finite number > 0, got {epsilon}")
    return float(epsilon)


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"unknown accountant {accountant!r} (expected one of {', '.join(ACCOUNTANTS)})")
    return accountant


def relation_name(relation: Relation) -> str:
    """Lower-case name of a neighbouring relation (same spelling as the mechanisms' RELATION_NAMES)."""
    return RELATION_NAMES.get(relation, relation.name.lower())


# ---------------------------------------------------------------- accountants

def make_accountant(accountant: str, relation: Relation = ADD_OR_REMOVE_ONE) -> dp_accounting.PrivacyAccountant:
    """A fresh (empty) dp_accounting accountant of the named kind."""
    check_accountant(accountant)
    if accountant == RDP:
        return RdpAccountant(neighboring_relation=relation)
    return PLDAccountant(neighboring_relation=relation,
                         value_discretization_interval=PLD_VALUE_DISCRETIZATION)


def describe_event(event: dp_accounting.DpEvent) -> str:
    """Short structural name of an event, e.g. ``SelfComposed(PoissonSampled(Gaussian))``."""
    name = type(event).__name__.removesuffix("DpEvent")
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return f"{name}({', '.join(describe_event(e) for e in event.events)})"
    inner = getattr(event, "event", None)
    if isinstance(inner, dp_accounting.DpEvent):
        return f"{name}({describe_event(inner)})"
    return name


def is_non_private(event: dp_accounting.DpEvent) -> bool:
    """True if the event contains a ``NonPrivateDpEvent`` anywhere (then ε = ∞)."""
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
        return True
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(is_non_private(e) for e in event.events)
    inner = getattr(event, "event", None)
    return isinstance(inner, dp_accounting.DpEvent) and is_non_private(inner)


def _dp_accounting_reason(err: Exception) -> str:
    """The bracketed reason of an ``UnsupportedEventError`` (or the whole message), on one line."""
    text = str(err)
    if "Error: [" in text and "] caused by" in text:
        text = text.split("Error: [", 1)[1].rsplit("] caused by", 1)[0]
    return " ".join(text.split()).rstrip(".")


def _alternative_hint(event: dp_accounting.DpEvent, accountant: str, relation: Relation) -> str:
    """'; the X accountant supports it' when another accountant can interpret the event."""
    others = [a for a in ACCOUNTANTS if a != accountant and make_accountant(a, relation).supports(event)]
    return f"; the {others[0]} accountant supports it" if others else ""


def compute_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str = RDP,
                    relation: Relation = ADD_OR_REMOVE_ONE) -> float:
    """ε at ``delta`` of ``event`` under ``relation``, as computed by the named accountant.

    Pass the relation the mechanism states (``mechanism.neighboring_relation(sampler)``): the
    event's noise multiplier is per unit of sensitivity *under that relation*. A
    ``NonPrivateDpEvent`` anywhere gives ``math.inf``. Raises ``ConfigError`` if the accountant
    cannot interpret the event (e.g. ``SampledWithoutReplacementDpEvent`` under PLD).
    """
    check_delta(delta)
    check_accountant(accountant)
    if is_non_private(event):
        return math.inf
    try:
        eps = float(make_accountant(accountant, relation).compose(event).get_epsilon(delta))
    except (dp_accounting.UnsupportedEventError, ValueError, NotImplementedError) as err:
        raise ConfigError(
            f"the {accountant} accountant cannot account {describe_event(event)} under "
            f"{relation_name(relation)} neighbouring ({_dp_accounting_reason(err)})"
            f"{_alternative_hint(event, accountant, relation)}") from err
    if math.isnan(eps) or eps < 0:
        raise ConfigError(f"the {accountant} accountant returned epsilon={eps} for {describe_event(event)}")
    return eps


# ---------------------------------------------------------------- calibration

def calibrate_noise_multiplier(make_event: EventMaker, target_epsilon: float, delta: float,
                               accountant: str = RDP, relation: Relation = ADD_OR_REMOVE_ONE,
                               rtol: float = CALIBRATION_RTOL) -> float:
    """Smallest noise multiplier σ (to relative tolerance ``rtol``) with ε(make_event(σ)) ≤ target.

    Assumes ε is non-increasing in σ (true for Gaussian-based events). Brackets σ by doubling or
    halving from 1, locates the crossing ε(σ) = target with Brent's method (scipy ``brentq``,
    relative tolerance ``rtol/4``), then returns the first of σ·(1 + rtol/2)^k, k = 0, 1, …, whose ε
    was *evaluated* to be ≤ target (falling back to geometric bisection of the bracket). So
    ε(result) ≤ target holds by construction, and result ≤ σ*·(1 + rtol) for the exact crossing σ*.
    ``make_event`` should be the mechanism's own
    ``lambda s: mechanism.dp_event(sampler, rounds, noise_multiplier=s)``.
    Raises ``ConfigError`` if even σ = 1e6 does not reach the target (e.g. below RDP's floor set by
    its largest order) or if the event cannot be accounted.
    """
    check_epsilon(target_epsilon)
    check_delta(delta)
    check_accountant(accountant)

    memo: dict[float, float] = {}

    def gap(sigma: float) -> float:
        if sigma not in memo:
            memo[sigma] = compute_epsilon(make_event(sigma), delta, accountant, relation) - target_epsilon
        return memo[sigma]

    def fits(sigma: float) -> bool:
        return gap(sigma) <= 0

    lo, hi = _bracket(fits, target_epsilon, delta, accountant)
    if fits(lo):  # only when even MIN_NOISE_MULTIPLIER/2 is within budget
        return lo
    if not math.isfinite(gap(lo)):
        return _bisect(fits, lo, hi, rtol)
    candidate = float(optimize.brentq(gap, lo, hi, xtol=1e-12, rtol=rtol / 4))
    for _ in range(4):
        if candidate >= hi:
            return hi
        if fits(candidate):
            return candidate
        lo = max(lo, candidate)
        candidate *= 1.0 + rtol / 2
    return _bisect(fits, lo, hi, rtol)


def _bisect(fits: Callable[[float], bool], lo: float, hi: float, rtol: float) -> float:
    """Geometric bisection keeping ``fits(hi)``; returns ``hi`` once ``hi/lo ≤ 1 + rtol``."""
    while hi > lo * (1.0 + rtol):
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _bracket(fits: Callable[[float], bool], target_epsilon: float, delta: float,
             accountant: str) -> tuple[float, float]:
    """``(lo, hi)`` with ``fits(hi)`` true and ``fits(lo)`` false (lo, hi > 0, hi = 2·lo)."""
    sigma = 1.0
    if fits(sigma):
        while sigma > MIN_NOISE_MULTIPLIER:
            if not fits(sigma / 2.0):
                return sigma / 2.0, sigma
            sigma /= 2.0
        return MIN_NOISE_MULTIPLIER / 2.0, sigma  # practically non-private noise already fits
    while sigma < MAX_NOISE_MULTIPLIER:
        if fits(sigma * 2.0):
            return sigma, sigma * 2.0
        sigma *= 2.0
    raise ConfigError(
        f"target epsilon {target_epsilon} at delta {delta} is unreachable with the {accountant} "
        f"accountant even at noise multiplier {MAX_NOISE_MULTIPLIER:g}")
