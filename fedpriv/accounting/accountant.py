"""Interpret DpEvents with dp_accounting's accountants: epsilon for an event, noise for a target.

The accounting package never writes its own epsilon formula. A mechanism object builds the
``DpEvent`` of what it releases (``mechanism.dp_event(sampler, rounds)``); this module only hands
that event to ``dp_accounting``:

* ``"rdp"``: ``RdpAccountant`` with dp_accounting's default orders (1.1 … 10.9, 11 … 63, 128,
  256, 512, 1024) and its improved RDP → (ε, δ) conversion. At very small ε the optimum can sit on
  the largest order (1024), so the result is then a slightly loose upper bound. For a fractional
  order whose series does not converge in 1,000 terms (low orders, α < 2, at large sampling rates
  and noise) dp_accounting takes that order's RDP as infinite, logging "Excluding this order from
  the epsilon computation": ε is then the minimum over the other orders, still an upper bound (one
  order's bound never depends on another's), looser only where the optimum would sit at an
  excluded order (large ε: above 25 in a grid of rates up to 0.5, noise 0.2 to 5 and up to 1,000
  rounds, where it was up to 2.7× looser than those orders' exact RDP gives). That note is dropped
  at its source (:data:`EXCLUDED_ORDER_NOTE`, on absl's logger); dp_accounting's other warnings
  are kept. An RDP vector with a *negative* entry (floating-point cancellation at extreme events,
  which dp_accounting would convert to ε = 0, δ = 0) is refused instead
  (:mod:`fedpriv.accounting.rdp_conversion` says why dropping those orders is not sound either):
  every RDP conversion here goes through :func:`accountant_epsilon`, :func:`accountant_delta` or
  that module, never ``get_epsilon``/``get_delta`` of an RDP accountant.
* ``"pld"``: ``PLDAccountant`` with ``value_discretization_interval=1e-4`` (pessimistic
  discretisation, so still an upper bound). Calibration searches on coarser (also pessimistic)
  discretisations first and only checks its answer at 1e-4, so it needs few fine evaluations.

* ``"mc"``: the Monte-Carlo accountant of :mod:`fedpriv.accounting.monte_carlo`, for the one event
  dp_accounting has no interpretation of — a ``MonteCarloDpEvent`` (a Toeplitz matrix mechanism
  under balls-in-bins participation) — and for nothing else. Its ε is an upper bound that holds
  with a stated confidence over its own public samples (``MonteCarloSettings``).

Anything an accountant cannot interpret raises :class:`~fedpriv.errors.ConfigError` (fail closed):
a number is never produced for an event that was not actually accounted.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from scipy import optimize

import fedpriv.accounting.monte_carlo as monte_carlo
from fedpriv.accounting.ddgauss import DistributedDiscreteGaussianDpEvent
from fedpriv.accounting.monte_carlo import MC, MonteCarloDpEvent, MonteCarloSettings
from fedpriv.accounting.rdp_conversion import RdpBelowResolution, delta_from_rdp, epsilon_from_rdp
from fedpriv.errors import ConfigError

RDP = "rdp"
PLD = "pld"
ACCOUNTANTS = (RDP, PLD, MC)
PLD_VALUE_DISCRETIZATION = 1e-4
PLD_SEARCH_DISCRETIZATIONS = (1e-2, 1e-3)  # calibration's coarse passes; the answer is checked at 1e-4
ADD_OR_REMOVE_ONE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


class _ExcludedOrderNote(logging.Filter):
    """Drops dp_accounting's note that an RDP order's series did not converge and the order is
    excluded (module docstring: the ε stays an upper bound); passes every other record."""

    NOTE = "_compute_log_a_frac failed to converge"  # the start of the note's format string

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOTE)


# on absl's logger, where dp_accounting logs (in every process that accounts: a run, a simulation's
# workers, the calculators); added once, when this module is first imported
EXCLUDED_ORDER_NOTE = _ExcludedOrderNote()
logging.getLogger("absl").addFilter(EXCLUDED_ORDER_NOTE)

# Calibration search range and default relative tolerance on the noise multiplier.
MIN_NOISE_MULTIPLIER = 1e-6
MAX_NOISE_MULTIPLIER = 1e6
CALIBRATION_RTOL = 1e-4

Relation = dp_accounting.NeighboringRelation
EventMaker = Callable[[float], dp_accounting.DpEvent]
# how privacy.json names a neighbouring relation (REPLACE_SPECIAL: zeroing out one user's data)
RELATION_NAMES = {Relation.ADD_OR_REMOVE_ONE: "add_or_remove_one", Relation.REPLACE_ONE: "replace_one",
                  Relation.REPLACE_SPECIAL: "zero_out"}


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
    """Lower-case name of a neighbouring relation (:data:`RELATION_NAMES`)."""
    return RELATION_NAMES.get(relation, relation.name.lower())


# ---------------------------------------------------------------- accountants

def make_accountant(accountant: str, relation: Relation = ADD_OR_REMOVE_ONE,
                    discretization: float = PLD_VALUE_DISCRETIZATION) -> dp_accounting.PrivacyAccountant:
    """A fresh (empty) dp_accounting accountant of the named kind (``discretization``: PLD's
    value discretization interval; anything but the default is for calibration's search only).
    The Monte-Carlo accountant is not a dp_accounting accountant: it has none."""
    check_accountant(accountant)
    if accountant == MC:
        raise ConfigError("the mc accountant interprets its own events only (no dp_accounting accountant)")
    if accountant == RDP:
        return RdpAccountant(neighboring_relation=relation)
    return PLDAccountant(neighboring_relation=relation, value_discretization_interval=discretization)


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
    others = [a for a in (RDP, PLD) if a != accountant and make_accountant(a, relation).supports(event)]
    return f"; the {others[0]} accountant supports it" if others else ""


# What one PLD computation may hold, estimated up front (fedpriv refuses beyond it): the grid of a
# composed privacy loss distribution, times the FFT's temporaries.
PLD_MEMORY_LIMIT = 2 << 30
_PLD_BYTES_PER_POINT = 64
_TAIL_SIGMAS = 8.3  # sqrt(2 ln 1e15): dp_accounting truncates tails of mass 1e-15


class AccountingTooCostly(ConfigError):
    """An accounting query whose up-front cost estimate exceeds a stated limit."""


def _gaussian_parts(event: dp_accounting.DpEvent, count: int = 1, rate: float = 1.0) -> list[tuple[float, int, float]]:
    """(noise multiplier, repetitions, sampling rate) of every Gaussian inside ``event``."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return [(event.noise_multiplier, count, rate)]
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _gaussian_parts(event.event, count * event.count, rate)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return [part for e in event.events for part in _gaussian_parts(e, count, rate)]
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        return _gaussian_parts(event.event, count, rate * event.sampling_probability)
    inner = getattr(event, "event", None)
    return _gaussian_parts(inner, count, rate) if isinstance(inner, dp_accounting.DpEvent) else []


def pld_bytes(event: dp_accounting.DpEvent, discretization: float = PLD_VALUE_DISCRETIZATION) -> float:
    """An estimate of the memory dp_accounting's PLD needs for ``event`` (about 64 bytes per grid
    point, measured). One Gaussian release of multiplier σ has privacy loss N(1/(2σ²), 1/σ²);
    Poisson sampling at rate q narrows its standard deviation to about q·√(e^{1/σ²} − 1) (the
    χ² distance), never above 1/σ. n releases compose to a loss of standard deviation √n times
    that; the grid spans it ±8.3 standard deviations (the tail truncation), plus the span of one
    release, ±8.3/σ around 1/(2σ²)."""
    points = 0.0
    for sigma, n, q in _gaussian_parts(event):
        if sigma <= 0:
            continue
        spread = min(1.0 / sigma, q * math.sqrt(math.expm1(min(1.0 / sigma ** 2, 700.0))))
        points += (2 * _TAIL_SIGMAS * math.sqrt(n) * spread + 2 * _TAIL_SIGMAS / sigma
                   + 0.5 / sigma ** 2) / discretization
    return points * _PLD_BYTES_PER_POINT


def _ddgauss_epsilon(event: DistributedDiscreteGaussianDpEvent, delta: float, accountant: str,
                     relation: Relation) -> float:
    """ε of a distributed discrete Gaussian event: RDP only, under add/remove or zero-out (its
    docstring says why both); ``ConfigError`` for any other pair."""
    if accountant != RDP:
        raise ConfigError(f"the distributed discrete Gaussian is accounted by RDP only (the paper's Proposition 14 "
                          f"bound), not by {accountant}: use the rdp accountant")
    allowed = (Relation.ADD_OR_REMOVE_ONE, Relation.REPLACE_SPECIAL) if event.fixed_parties else (
        Relation.REPLACE_SPECIAL,)
    if relation not in allowed:
        raise ConfigError(f"the distributed discrete Gaussian's accounting is stated under zero-out neighbouring"
                          f"{', or add/remove with shares from fixed parties' if event.fixed_parties else ''}, not "
                          f"{relation_name(relation)}")
    return event.epsilon(delta)


def _below_resolution(err: RdpBelowResolution, event: dp_accounting.DpEvent,
                      relation: Relation) -> RdpBelowResolution:
    """``err`` with the accountant that can account ``event`` instead, if there is one."""
    return RdpBelowResolution(f"{err}{_alternative_hint(event, RDP, relation)}")


def accountant_epsilon(composed: dp_accounting.PrivacyAccountant, event: dp_accounting.DpEvent, delta: float,
                       relation: Relation = ADD_OR_REMOVE_ONE) -> float:
    """ε at ``delta`` of an accountant that has composed ``event``: an RDP accountant's through
    :func:`~fedpriv.accounting.rdp_conversion.epsilon_from_rdp` (a negative RDP value raises
    :class:`RdpBelowResolution`, never ε = 0), any other's ``get_epsilon``."""
    if not isinstance(composed, RdpAccountant):
        return float(composed.get_epsilon(delta))
    try:
        return epsilon_from_rdp(composed.orders, composed.rdp, delta, describe_event(event))
    except RdpBelowResolution as err:
        raise _below_resolution(err, event, relation) from None


def accountant_delta(composed: dp_accounting.PrivacyAccountant, event: dp_accounting.DpEvent, epsilon: float,
                     relation: Relation = ADD_OR_REMOVE_ONE) -> float:
    """δ at ``epsilon`` of an accountant that has composed ``event``; as :func:`accountant_epsilon`
    (a negative RDP value raises, never δ = 0)."""
    if not isinstance(composed, RdpAccountant):
        return float(composed.get_delta(epsilon))
    try:
        return delta_from_rdp(composed.orders, composed.rdp, epsilon, describe_event(event))
    except RdpBelowResolution as err:
        raise _below_resolution(err, event, relation) from None


def _monte_carlo_event(event: dp_accounting.DpEvent, accountant: str, relation: Relation) -> bool:
    """Whether ``event`` goes to the Monte-Carlo accountant; ConfigError for a pair that cannot be
    accounted (a balls-in-bins event elsewhere, another event there, replace-one neighbouring)."""
    if isinstance(event, MonteCarloDpEvent) != (accountant == MC):
        if accountant == MC:
            raise ConfigError(f"the mc accountant accounts balls-in-bins and b-min-sep participation only "
                              f"(sampling=balls_in_bins, b_min_sep), not {describe_event(event)}: use rdp or pld")
        raise ConfigError(f"{type(event).__name__.removesuffix('DpEvent')} participation (balls-in-bins, b-min-sep) "
                          f"has no {accountant} accounting in dp_accounting: use the Monte-Carlo accountant "
                          "(privacy.accountant=mc, or --accountant mc)")
    if accountant == MC and relation == dp_accounting.NeighboringRelation.REPLACE_ONE:
        raise ConfigError("the Monte-Carlo dominating pairs are stated for add/remove-one and zero-out "
                          "neighbouring, not replace-one")
    return accountant == MC


def compute_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str = RDP,
                    relation: Relation = ADD_OR_REMOVE_ONE,
                    discretization: float = PLD_VALUE_DISCRETIZATION,
                    monte_carlo_settings: MonteCarloSettings | None = None) -> float:
    """ε at ``delta`` of ``event`` under ``relation``, as computed by the named accountant.

    Pass the relation the mechanism states (``mechanism.neighboring_relation(sampler)``): the
    event's noise multiplier is per unit of sensitivity *under that relation*. A
    ``NonPrivateDpEvent`` anywhere gives ``math.inf``. Raises ``ConfigError`` if the accountant
    cannot interpret the event (e.g. ``SampledWithoutReplacementDpEvent`` under PLD).
    ``monte_carlo_settings``: the mc accountant's (default ``MonteCarloSettings()``). An RDP vector
    below floating-point resolution (a negative order) raises :class:`RdpBelowResolution` (a
    ``ConfigError``), never ε = 0; a ``NoOpDpEvent`` is exactly 0.
    """
    check_delta(delta)
    check_accountant(accountant)
    if is_non_private(event):
        return math.inf
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.SelfComposedDpEvent) and isinstance(event.event,
                                                                           DistributedDiscreteGaussianDpEvent):
        event = event.event.repeated(event.count)  # its rounds compose in RDP: one event of count × rounds
    if isinstance(event, DistributedDiscreteGaussianDpEvent):
        return _ddgauss_epsilon(event, delta, accountant, relation)
    if _monte_carlo_event(event, accountant, relation):
        return monte_carlo.epsilon(event, delta, monte_carlo_settings or MonteCarloSettings())
    if accountant == PLD and (need := pld_bytes(event, discretization)) > PLD_MEMORY_LIMIT:
        raise AccountingTooCostly(
            f"the pld accountant would need ~{need / 2**30:.1f} GB for {describe_event(event)} (limit "
            f"{PLD_MEMORY_LIMIT / 2**30:.0f} GB: noise this small makes its privacy-loss grid huge); use the rdp "
            "accountant")
    try:
        composed = make_accountant(accountant, relation, discretization).compose(event)
    except (dp_accounting.UnsupportedEventError, ValueError, NotImplementedError) as err:
        raise ConfigError(
            f"the {accountant} accountant cannot account {describe_event(event)} under "
            f"{relation_name(relation)} neighbouring ({_dp_accounting_reason(err)})"
            f"{_alternative_hint(event, accountant, relation)}") from err
    eps = accountant_epsilon(composed, event, delta, relation)
    if math.isnan(eps) or eps < 0:
        raise ConfigError(f"the {accountant} accountant returned epsilon={eps} for {describe_event(event)}")
    return eps


class SelfComposition:
    """ε after ``count`` repetitions of one event, for growing counts, without recomposing.

    ``epsilon(count)`` equals ``compute_epsilon(SelfComposedDpEvent(event, count), ...)``: dp_accounting
    builds the event's representation once — RDP: its vector over the orders, scaled by ``count``;
    PLD: its privacy loss distribution, composed with itself one more time per new round (from the
    nearest smaller count kept). A count far from every kept one (the planned run's, checked before
    round 1; a resumed round) is computed exactly as calibration computes it, so the budget check
    and calibration agree to the last bit. This is how the ledger's per-round epsilon costs one
    round, not the whole run, with either accountant. Falls back to the full computation if
    dp_accounting stops exposing its representation; PLD's memory limit applies as everywhere.
    """

    _KEEP = 3  # PLDs kept (the planned run's, and the latest rounds')
    _STEPS = 16  # at most this many single compositions from a kept PLD; beyond, one self-composition

    def __init__(self, event: dp_accounting.DpEvent, delta: float, accountant: str, relation: Relation) -> None:
        self.event, self.delta, self.accountant, self.relation = event, check_delta(delta), accountant, relation
        one = make_accountant(accountant, relation)
        supported = one.supports(event)  # else every count goes to compute_epsilon, which says why it cannot
        if supported:
            one.compose(event)
        self._rdp = getattr(one, "_rdp", None) if accountant == RDP and supported else None  # dp_accounting 0.6.0
        self._orders = getattr(one, "_orders", None)
        pld = getattr(one, "_pld", None) if accountant == PLD and supported else None
        self._plds: dict[int, object] = {1: pld} if hasattr(pld, "get_epsilon_for_delta") else {}
        self._eps: dict[int, float] = {}

    def epsilon(self, count: int) -> float:
        """ε of ``count`` repetitions; the first value computed for a count is kept, so a count
        computed once (the planned run's, before round 1) never changes afterwards."""
        if count not in self._eps:
            self._eps[count] = self._compute(count)
        return self._eps[count]

    def _compute(self, count: int) -> float:
        if count == 0:
            return 0.0
        composed = dp_accounting.SelfComposedDpEvent(self.event, count)
        if self._rdp is not None and self._orders is not None:
            try:
                return epsilon_from_rdp(self._orders, count * self._rdp, self.delta, describe_event(composed))
            except RdpBelowResolution as err:
                raise _below_resolution(err, composed, self.relation) from None
        if not self._plds:
            return compute_epsilon(composed, self.delta, self.accountant, self.relation)
        if (need := pld_bytes(composed)) > PLD_MEMORY_LIMIT:
            raise AccountingTooCostly(f"the pld accountant would need ~{need / 2**30:.1f} GB for "
                                      f"{describe_event(composed)} (limit {PLD_MEMORY_LIMIT / 2**30:.0f} GB); use rdp")
        base = max(c for c in self._plds if c <= count)
        if count - base <= self._STEPS:
            pld = self._plds[base]
            for _ in range(count - base):
                pld = pld.compose(self._plds[1])
            value = float(pld.get_epsilon_for_delta(self.delta))
        else:  # a jump (the planned run, a resumed round): exactly what calibration computed
            value = compute_epsilon(composed, self.delta, self.accountant, self.relation)
            pld = self._plds[1].self_compose(count)  # the base of the rounds after it
        self._plds[count] = pld
        while len(self._plds) > self._KEEP:
            del self._plds[min(c for c in self._plds if c != 1)]
        return value


# ---------------------------------------------------------------- calibration

def calibrate_noise_multiplier(make_event: EventMaker, target_epsilon: float, delta: float,
                               accountant: str = RDP, relation: Relation = ADD_OR_REMOVE_ONE,
                               rtol: float = CALIBRATION_RTOL,
                               monte_carlo_settings: MonteCarloSettings | None = None,
                               progress: monte_carlo.Progress | None = None) -> float:
    """Smallest noise multiplier σ (to relative tolerance ``rtol``) with ε(make_event(σ)) ≤ target.

    Assumes ε is non-increasing in σ (true for Gaussian-based events). Brackets σ by doubling or
    halving from 1, locates the crossing ε(σ) = target with Brent's method (scipy ``brentq``,
    relative tolerance ``rtol/4``), then returns the first of σ·(1 + rtol/2)^k, k = 0, 1, …, whose ε
    was *evaluated* to be ≤ target (falling back to geometric bisection of the bracket). So
    ε(result) ≤ target holds by construction, and result ≤ σ*·(1 + rtol) for the exact crossing σ*.
    ``make_event`` should be the mechanism's own
    ``lambda s: mechanism.dp_event(sampler, rounds, noise_multiplier=s)``.
    Raises ``ConfigError`` if even σ = 1e6 does not reach the target (e.g. below RDP's floor set by
    its largest order) or if the event cannot be accounted. A σ whose RDP is below floating-point
    resolution (:class:`RdpBelowResolution`) has no known ε and is taken as *not* fitting, so the
    result is always a σ whose ε was computed to be ≤ target; if the search ends without one for
    that reason, that error is raised.

    The mc accountant searches its own public grid of σ instead (:func:`monte_carlo.calibrate`:
    every grid point is a candidate its confidence is shared over); ``rtol`` does not apply, and
    ``progress`` is told of its samples as they are drawn.
    """
    check_epsilon(target_epsilon)
    check_delta(delta)
    check_accountant(accountant)
    if _monte_carlo_event(make_event(1.0), accountant, relation):
        return monte_carlo.calibrate(make_event, target_epsilon, delta, monte_carlo_settings or MonteCarloSettings(),
                                     progress=progress)
    start, step = 1.0, 2.0
    if accountant == PLD:  # cheap pessimistic passes first: the fine (reported) one starts next to its answer
        for coarse in PLD_SEARCH_DISCRETIZATIONS:
            start = _calibrate(make_event, target_epsilon, delta, accountant, relation, max(rtol, 1e-4), start,
                               step, coarse)
            step = 1.01
    return _calibrate(make_event, target_epsilon, delta, accountant, relation, rtol, start, step,
                      PLD_VALUE_DISCRETIZATION)


def _calibrate(make_event: EventMaker, target_epsilon: float, delta: float, accountant: str, relation: Relation,
               rtol: float, start: float, step: float, discretization: float) -> float:
    """One search of :func:`calibrate_noise_multiplier` at one PLD discretization, bracketing from
    ``start`` by factors ``step``, ``step²``, … ."""
    memo: dict[float, float] = {}
    unresolved: list[RdpBelowResolution] = []

    def gap(sigma: float) -> float:
        if sigma not in memo:
            try:
                memo[sigma] = compute_epsilon(make_event(sigma), delta, accountant, relation,
                                              discretization) - target_epsilon
            except AccountingTooCostly:  # such small noise is far above any budget PLD is used for
                memo[sigma] = math.inf
            except RdpBelowResolution as err:  # no ε known there: never taken as fitting
                unresolved.append(err)
                memo[sigma] = math.inf
        return memo[sigma]

    def fits(sigma: float) -> bool:
        return gap(sigma) <= 0

    try:
        lo, hi = _bracket(fits, target_epsilon, delta, accountant, start, step)
    except ConfigError as err:
        if unresolved:  # the search went past the noise the rdp accountant resolves: say so
            raise RdpBelowResolution(f"calibrating to target epsilon {target_epsilon} at delta {delta}: "
                                     f"{unresolved[0]}") from err
        raise
    if fits(lo):  # only when even MIN_NOISE_MULTIPLIER/2 is within budget
        return lo
    if not math.isfinite(gap(lo)) or unresolved:
        return _bisect(fits, lo, hi, rtol)
    candidate = float(optimize.brentq(gap, lo, hi, xtol=1e-12, rtol=rtol / 4))
    if unresolved:  # an unresolved σ inside the bracket (an infinite gap): Brent's answer is not trusted
        return _bisect(fits, lo, hi, rtol)
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


def _bracket(fits: Callable[[float], bool], target_epsilon: float, delta: float, accountant: str,
             start: float = 1.0, step: float = 2.0) -> tuple[float, float]:
    """``(lo, hi)`` with ``fits(hi)`` true and ``fits(lo)`` false (lo, hi > 0), searched from
    ``start`` by factors ``step``, then ``step²``, … (each miss squares the factor, up to 2)."""
    sigma = start
    if fits(sigma):
        while sigma > MIN_NOISE_MULTIPLIER:
            if not fits(sigma / step):
                return sigma / step, sigma
            sigma /= step
            step = min(step * step, 2.0)
        return MIN_NOISE_MULTIPLIER / 2.0, sigma  # practically non-private noise already fits
    while sigma < MAX_NOISE_MULTIPLIER:
        if fits(sigma * step):
            return sigma, sigma * step
        sigma *= step
        step = min(step * step, 2.0)
    raise ConfigError(
        f"target epsilon {target_epsilon} at delta {delta} is unreachable with the {accountant} "
        f"accountant even at noise multiplier {MAX_NOISE_MULTIPLIER:g}")
