"""Cohort samplers. Each one states the sampling that the accountant must assume.

A sampler's draw for round ``t`` depends only on ``(key, t)``: the sampling key comes from the
run's :class:`~fedpriv.keys.randomness.RunRandomness` (secret in secure mode, derived from the config in
research mode), so a resumed run draws the same cohorts as an uninterrupted one without saving
sampler state, and nobody without the key can tell who was sampled — which amplification by
sampling assumes. A sampler built without a key (``key=None``) only states its accounting
(calculators); drawing from it is an error.

User ``u``'s draw in round ``t`` is the ``u``-th value of the round's keystream, so it does not
depend on the population size; the cyclic-Poisson group of ``u`` is a keyed hash of ``u`` alone.

The rate of the Poisson-type samplers (q = m/N, cyclic-Poisson's m·b/N) is fixed either by a
public population size that the config states (``population``: then adding or removing a user
changes nobody else's participation, and add/remove-one neighbouring holds), or by the dataset's
own count (``rate_from_data``): then one more user changes every user's rate, and the relation
that holds is zero-out — a user's data replaced by a null contribution, the population size
fixed — under which dp_accounting gives the sampled Gaussian the same epsilon
(:func:`fedpriv.mechanisms.base.amplified_relation`). Every rate a sampler draws with or publishes
(``rate``, ``expected_cohort``, a group rate, bins, a b-min-sep probability) is computed from one
N, :attr:`Sampler.rate_population`: the public one where the config states it, since under
add/remove-one the data's own count is private.

``sample_extra(t, key, count)`` draws, from another key, which of ``count`` units outside the
population (an audit's canaries, :mod:`fedpriv.audit.canaries`) take part in round t with the
participation a user has under the sampler's pattern; for a given sampling key, the population's
own draws do not depend on them.
Fixed-size sampling refuses: its replace-one accounting has no place for a unit outside the cohort.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedpriv.errors import ConfigError
from fedpriv.keys.randomness import uint64s, uniforms
from fedpriv.schema import register_sampler_kind

POISSON = "poisson"
FIXED_SIZE = "fixed"
CYCLIC = "cyclic"
CYCLIC_POISSON = "cyclic_poisson"
BALLS_IN_BINS = "balls_in_bins"
B_MIN_SEP = "b_min_sep"


class ParticipationPattern:
    """What the accountant may assume about when a unit takes part: mechanisms recognise a
    sampler by its pattern class (never by its name); ``kind`` only names it to people."""


class PoissonPattern(ParticipationPattern):
    """Each unit joins each round independently with probability ``rate`` (amplification by
    sampling, add/remove-one neighbouring)."""


class FixedSizePattern(ParticipationPattern):
    """A uniformly random cohort of fixed size ``cohort`` out of ``population`` each round
    (sampling without replacement, replace-one neighbouring)."""


class SeparatedPattern(ParticipationPattern):
    """A fixed order: at most ``max_participations(T)`` participations in T rounds, at least
    ``min_separation`` rounds strictly between two (no amplification)."""


class GroupedPoissonPattern(ParticipationPattern):
    """``groups`` disjoint groups in turn, Poisson sampling with ``group_rate`` inside the group
    of the round (amplified, and separated by ``groups`` rounds)."""


class BallsInBinsPattern(ParticipationPattern):
    """Each unit is assigned one of ``bins`` bins uniformly and independently (secretly) and takes
    part in exactly the rounds ``t ≡ bin (mod bins)`` (amplified by the secrecy of the bin; accounted
    by Monte Carlo, :mod:`fedpriv.accounting.monte_carlo`)."""


class MinSeparationPattern(ParticipationPattern):
    """A unit is eligible unless it took part in one of the ``separation − 1`` rounds before; an
    eligible unit takes part with ``probability``, on its own coins (amplified; accounted by Monte
    Carlo, :mod:`fedpriv.accounting.min_separation`)."""


class Sampler(ParticipationPattern, abc.ABC):
    """The contract of a sampler: ``kind`` (its config name), the ``population`` it draws from,
    the fixed denominator ``expected_cohort``, round t's cohort from ``(key, t)`` alone
    (:meth:`sample`: sorted, distinct unit indices), and :meth:`sample_extra` for units outside
    the population (canaries) with the participation a unit has under its pattern (or a
    ``ConfigError`` where its accounting has no place for them). Its pattern class
    (:class:`PoissonPattern`, ...) is what mechanisms account; a sampler of a new pattern is
    refused by every mechanism until one states its accounting."""

    kind: str
    population: int
    public_population: int | None = None  # the config's N, where one fixed the rates (Poisson-type kinds only)

    @property
    def rate_population(self) -> int:
        """N of every rate the sampler draws with and publishes: the config's public population
        where one is given, else the data's own count. Under add/remove-one (a public N) the data's
        count differs between neighbours, so no published rate may be computed from it."""
        return self.public_population or self.population

    @property
    @abc.abstractmethod
    def expected_cohort(self) -> float:
        """The fixed, public denominator of the round's sum."""

    @abc.abstractmethod
    def sample(self, round_idx: int) -> np.ndarray:
        """Round ``round_idx``'s cohort: sorted, distinct int64 indices into the population."""

    def participation_cap(self, rounds: int) -> int:
        """The most rounds of ``rounds`` one unit can take part in under this sampler's rule
        (here: every round; a separated or binned sampler narrows it). Read by the plan's
        statement of participations, not by the accounting (``max_participations`` is the
        separated patterns' accounting bound)."""
        return rounds

    @abc.abstractmethod
    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population take part in round ``round_idx`` (draws from ``key``)."""


def _need_key(key: bytes | None) -> bytes:
    if key is None:
        raise ValueError("this sampler was built for accounting only (no sampling key): it cannot draw cohorts")
    return key


@dataclass(frozen=True)
class PoissonSampler(PoissonPattern, Sampler):
    """Each of ``population`` users joins round t independently with probability ``rate``.

    Accounting: ``PoissonSampledDpEvent(rate, ...)`` under add/remove-one neighbouring. The
    cohort size is random; aggregation divides by ``expected_cohort = rate * population``.
    """

    population: int
    rate: float
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = POISSON
    rate_from_data: bool = False  # q = m / (the dataset's count): zero-out, not add/remove (module docstring)
    public_population: int | None = None  # the config's N the rate was fixed from (None: the rate is given)

    @property
    def expected_cohort(self) -> float:
        """The fixed denominator: ``q·N`` with N the public population where one fixed the rate."""
        return self.rate * self.rate_population

    def sample(self, round_idx: int) -> np.ndarray:
        draws = uniforms(_need_key(self.key), "poisson", (round_idx,), self.population)
        return np.flatnonzero(draws < self.rate).astype(np.int64)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population (canaries) join round t, each with
        probability ``rate``, independently: draws from ``key``, not the sampling key."""
        return np.flatnonzero(uniforms(key, "extra-poisson", (round_idx,), count) < self.rate).astype(np.int64)


class _CohortSized:
    """Samplers whose expected cohort is ``cohort``: rate m/N (a unit's chance to take part in a
    round; N the :attr:`Sampler.rate_population`), expected cohort m."""

    cohort: int
    rate_population: int

    @property
    def rate(self) -> float:
        return self.cohort / self.rate_population

    @property
    def expected_cohort(self) -> float:
        return float(self.cohort)


@dataclass(frozen=True)
class FixedSizeSampler(_CohortSized, FixedSizePattern, Sampler):
    """Exactly ``cohort`` users drawn uniformly without replacement each round.

    Accounting: ``SampledWithoutReplacementDpEvent(population, cohort, ...)`` under the
    replace-one relation (the sum's sensitivity is then 2C).
    """

    population: int
    cohort: int
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = FIXED_SIZE

    def sample(self, round_idx: int) -> np.ndarray:
        """The ``cohort`` users with the smallest 64-bit keystream words this round: a uniformly
        random subset (ties, probability < N²/2⁶⁴, are broken by user id)."""
        words = uint64s(_need_key(self.key), "fixed", (round_idx,), self.population)
        return np.sort(np.argsort(words, kind="stable")[:self.cohort]).astype(np.int64)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Refused: a unit outside a fixed-size cohort has no participation that the replace-one
        accounting of this sampler covers (units join the population, not the cohort)."""
        raise ConfigError("sampling=fixed cannot take canaries: a unit added to a fixed-size cohort is not "
                          "accounted by its replace-one analysis (use sampling=poisson to audit)")


@functools.lru_cache(maxsize=4)
def _epoch_order(key: bytes, population: int) -> np.ndarray:
    """A uniformly random permutation of the population (sort by keystream words)."""
    return np.argsort(uint64s(key, "epoch-order", (), population), kind="stable")


@functools.lru_cache(maxsize=4)
def user_groups(key: bytes, population: int, groups: int) -> np.ndarray:
    """Group of each user ``u``: ``BLAKE2b_key(u) mod groups`` — a keyed hash of the user id alone,
    so adding or removing a user moves nobody else (the bias of ``mod`` is below 2⁻⁵⁰)."""
    out = np.empty(population, dtype=np.int64)
    for u in range(population):
        digest = hashlib.blake2b(u.to_bytes(8, "little"), key=key, digest_size=8).digest()
        out[u] = int.from_bytes(digest, "little") % groups
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class CyclicSampler(_CohortSized, SeparatedPattern, Sampler):
    """Epochs in a fixed order: the population is shuffled once (by the sampling key) and cut into
    ``blocks = population // cohort`` disjoint cohorts; round t takes block ``t mod blocks``.

    Participation (what tree/matrix-factorization accounting assumes): a user takes part at most
    once per ``blocks`` consecutive rounds, so at most ``⌈T/blocks⌉`` times in T rounds, with at
    least ``blocks − 1`` rounds strictly between two participations; T ≤ blocks is a single
    epoch. The ``population mod cohort`` users left over never take part. No amplification.
    """

    population: int
    cohort: int
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = CYCLIC

    @property
    def blocks(self) -> int:
        return self.population // self.cohort

    @property
    def min_separation(self) -> int:
        """Rounds strictly between two participations of one user (at least)."""
        return self.blocks - 1

    def max_participations(self, rounds: int) -> int:
        return -(-rounds // self.blocks)

    def participation_cap(self, rounds: int) -> int:
        return self.max_participations(rounds)

    def sample(self, round_idx: int) -> np.ndarray:
        order = _epoch_order(_need_key(self.key), self.population)
        block = round_idx % self.blocks
        return np.sort(order[block * self.cohort:(block + 1) * self.cohort]).astype(np.int64)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population (canaries) take part in round t: each
        has a uniformly random block (from ``key``) and joins the rounds of that block, so it takes
        part at most once per ``blocks`` rounds, like a user of the population."""
        block = uint64s(key, "extra-block", (), count) % np.uint64(self.blocks)
        return np.flatnonzero(block == np.uint64(round_idx % self.blocks)).astype(np.int64)


@dataclass(frozen=True)
class CyclicPoissonSampler(_CohortSized, GroupedPoissonPattern, Sampler):
    """b-min-separated Poisson sampling (amplified BandMF): user ``u`` belongs to group
    :func:`user_groups` (a keyed hash of ``u``, secret in secure mode); round t Poisson-samples
    group ``t mod groups`` with rate ``group_rate = cohort · groups / population``, so the expected
    cohort is ``cohort``.

    Accounting: a user is eligible in at most ⌈T/groups⌉ rounds, each a
    ``PoissonSampledDpEvent(group_rate, ...)`` under add/remove-one; consecutive eligible rounds
    are ``groups`` apart. The group of a user depends on its id and the key only, so a neighbouring
    dataset (one user added or removed) leaves every other user's rounds unchanged.
    """

    population: int
    cohort: int
    groups: int
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = CYCLIC_POISSON
    rate_from_data: bool = False  # the group rate from the dataset's count: zero-out (module docstring)
    public_population: int | None = None  # the config's N the group rate was fixed from

    @property
    def group_rate(self) -> float:
        return min(1.0, self.cohort * self.groups / self.rate_population)

    def participation_cap(self, rounds: int) -> int:
        """Eligible only in its group's rounds: one in ``groups``."""
        return -(-rounds // self.groups)

    def sample(self, round_idx: int) -> np.ndarray:
        key = _need_key(self.key)
        draws = uniforms(key, "cyclic-poisson", (round_idx,), self.population)
        chosen = (user_groups(key, self.population, self.groups) == round_idx % self.groups) & (draws < self.group_rate)
        return np.flatnonzero(chosen).astype(np.int64)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population (canaries) join round t: each has a
        uniformly random group (from ``key``) and is Poisson-sampled with ``group_rate`` in its
        group's rounds, like a user of the population."""
        group = uint64s(key, "extra-group", (), count) % np.uint64(self.groups)
        draws = uniforms(key, "extra-cyclic-poisson", (round_idx,), count)
        chosen = (group == np.uint64(round_idx % self.groups)) & (draws < self.group_rate)
        return np.flatnonzero(chosen).astype(np.int64)


@dataclass(frozen=True)
class BallsInBinsSampler(_CohortSized, BallsInBinsPattern, Sampler):
    """Balls-in-bins participation ("Near exact privacy amplification for matrix mechanisms",
    Choquette-Choo et al.): user ``u`` is in bin :func:`user_groups` (a keyed hash of ``u`` alone,
    uniform over ``bins``, secret in secure mode) and takes part in every round ``t`` with
    ``t mod bins`` equal to its bin. ``bins = N // cohort_size`` with N the public population (or
    the dataset's count: then zero-out neighbouring), so the expected cohort is ``N / bins``, about
    ``cohort_size``; the cohort size itself is random (binomial).

    Accounting: a user takes part ⌈(T − bin)/bins⌉ times in T rounds at a secret phase; the
    dominating pair is a mixture over the phase (``BallsInBinsDpEvent``), accounted by Monte Carlo
    (``privacy.accountant=mc``). Adding or removing a user moves nobody else's bin.
    """

    population: int
    cohort: int
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = BALLS_IN_BINS
    rate_from_data: bool = False  # bins from the dataset's count: zero-out (module docstring)
    public_population: int | None = None  # the config's N the bins were fixed from

    @property
    def bins(self) -> int:
        return max(1, self.rate_population // self.cohort)

    @property
    def rate(self) -> float:
        return 1.0 / self.bins

    @property
    def expected_cohort(self) -> float:
        return self.rate_population / self.bins

    def participation_cap(self, rounds: int) -> int:
        """Exactly the rounds of its bin: ⌈(rounds − bin)/bins⌉ ≤ ⌈rounds/bins⌉."""
        return -(-rounds // self.bins)

    def sample(self, round_idx: int) -> np.ndarray:
        bins = user_groups(_need_key(self.key), self.population, self.bins)
        return np.flatnonzero(bins == round_idx % self.bins).astype(np.int64)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population (canaries) take part in round t: each
        has a uniformly random bin (from ``key``) and joins that bin's rounds, like a user."""
        bins = uint64s(key, "extra-bin", (), count) % np.uint64(self.bins)
        return np.flatnonzero(bins == np.uint64(round_idx % self.bins)).astype(np.int64)


@dataclass(frozen=True)
class ParticipationBound(SeparatedPattern):
    """A participation pattern without a sampler, for calculators: every user takes part at most
    ``participations`` times, with at least ``min_separation`` rounds strictly between two
    participations (accounted like :class:`CyclicSampler`, with no amplification)."""

    participations: int
    min_separation: int
    kind: str = CYCLIC

    def max_participations(self, rounds: int) -> int:
        return min(self.participations, -(-rounds // (self.min_separation + 1)))


_MIN_SEP_RUNS: dict[tuple, tuple[np.ndarray, list[np.ndarray]]] = {}  # (key, domain, units, b, p) -> replay


def warm_start(separation: int, probability: float) -> np.ndarray:
    """P(first eligible round = j), j = 0 … b−1, in the stationary state of the eligibility chain."""
    b, p = separation, probability
    start = np.full(b, p / (1.0 + (b - 1) * p))
    start[0] = 1.0 / (1.0 + (b - 1) * p)
    return start


def min_separation_cohorts(key: bytes, domain: str, units: int, separation: int, probability: float,
                           round_idx: int) -> np.ndarray:
    """Round ``round_idx``'s participants of the b-min-sep chain of ``units`` units: each starts in
    the chain's stationary state (its own uniform from ``key``), and in round t an eligible unit
    takes part iff its round-t uniform is below p. A unit's draws are the u-th values of the
    rounds' keystreams, so they do not depend on how many units there are. Rounds are replayed
    from round 0 once and kept (a resumed run replays the rounds before it)."""
    cache_key = (key, domain, units, separation, probability)
    if cache_key not in _MIN_SEP_RUNS:
        if len(_MIN_SEP_RUNS) > 8:
            _MIN_SEP_RUNS.clear()
        start = np.searchsorted(np.cumsum(warm_start(separation, probability)),
                                uniforms(key, f"{domain}-start", (), units), side="right")
        _MIN_SEP_RUNS[cache_key] = (np.minimum(start, separation - 1).astype(np.int64), [])
    eligible_from, cohorts = _MIN_SEP_RUNS[cache_key]
    while len(cohorts) <= round_idx:
        t = len(cohorts)
        chosen = (eligible_from <= t) & (uniforms(key, domain, (t,), units) < probability)
        eligible_from[chosen] = t + separation
        cohorts.append(np.flatnonzero(chosen).astype(np.int64))
    return cohorts[round_idx]


@dataclass(frozen=True)
class MinSeparationSampler(_CohortSized, MinSeparationPattern, Sampler):
    """b-min-separated Poisson sampling (:func:`min_separation_cohorts`): b = ``groups`` (BandMF's
    bands) and p = m/(N − (b−1)m) with N the public population (or the dataset's count: then
    zero-out), so that the stationary expected cohort N·p/(1 + (b−1)p) is m = ``cohort``.

    Accounting: ``MinSeparationDpEvent`` (Monte Carlo). A user's participation depends on its own
    coins only, so adding or removing one moves nobody else (with a public N)."""

    population: int
    cohort: int
    groups: int
    key: bytes | None = field(default=None, repr=False)  # secret in secure mode: never printed
    kind: str = B_MIN_SEP
    rate_from_data: bool = False
    public_population: int | None = None

    @property
    def separation(self) -> int:
        return self.groups

    def participation_cap(self, rounds: int) -> int:
        """At most once in any ``separation`` consecutive rounds."""
        return -(-rounds // self.separation)

    @property
    def probability(self) -> float:
        return min(1.0, self.cohort / (self.rate_population - (self.groups - 1) * self.cohort))

    def sample(self, round_idx: int) -> np.ndarray:
        return min_separation_cohorts(_need_key(self.key), "b-min-sep", self.population, self.separation,
                                      self.probability, round_idx)

    def sample_extra(self, round_idx: int, key: bytes, count: int) -> np.ndarray:
        """Which of ``count`` units outside the population (canaries) take part: each runs the same
        chain on coins from ``key``, like a user."""
        return min_separation_cohorts(key, "extra-b-min-sep", count, self.separation, self.probability, round_idx)


@dataclass(frozen=True)
class BinsBound(BallsInBinsPattern):
    """Balls-in-bins participation without a sampler, for calculators: ``bins`` bins (each user
    in one, uniformly and secretly; rounds ``t ≡ bin (mod bins)``), accounted as
    :class:`BallsInBinsSampler` with a public rate (add/remove-one)."""

    bins: int
    kind: str = BALLS_IN_BINS


# (population, cohort_size, key, groups, public_population) -> the sampler
SamplerFactory = Callable[[int, int, "bytes | None", "int | None", "int | None"], Sampler]
SAMPLERS: dict[str, SamplerFactory] = {}
# kinds whose rate a public population may fix (Poisson-type: add/remove-one then holds)
PUBLIC_RATE_KINDS: set[str] = set()


def register_sampler(kind: str, public_rate: bool = False) -> Callable[[SamplerFactory], SamplerFactory]:
    """Make a sampler factory selectable as ``sampling=kind`` (``public_rate``: a Poisson-type
    sampler whose rate the config's ``population`` may fix). The factory returns a :class:`Sampler`."""
    def add(factory: SamplerFactory) -> SamplerFactory:
        SAMPLERS[kind] = factory
        register_sampler_kind(kind)  # the config's check of sampling=KIND reads the kinds there
        if public_rate:
            PUBLIC_RATE_KINDS.add(kind)
        return factory
    return add


def _rate_fixed(public_population: int | None) -> dict:
    return {"rate_from_data": public_population is None, "public_population": public_population}


@register_sampler(POISSON, public_rate=True)
def _poisson(population, cohort_size, key, groups, public_population) -> Sampler:
    return PoissonSampler(population=population, rate=cohort_size / (public_population or population), key=key,
                          **_rate_fixed(public_population))


@register_sampler(FIXED_SIZE)
def _fixed(population, cohort_size, key, groups, public_population) -> Sampler:
    return FixedSizeSampler(population=population, cohort=cohort_size, key=key)


@register_sampler(CYCLIC)
def _cyclic(population, cohort_size, key, groups, public_population) -> Sampler:
    return CyclicSampler(population=population, cohort=cohort_size, key=key)


@register_sampler(CYCLIC_POISSON, public_rate=True)
def _cyclic_poisson(population, cohort_size, key, groups, public_population) -> Sampler:
    rate_base = public_population or population
    if not groups or groups < 1 or cohort_size * groups > rate_base:
        raise ConfigError(f"sampling=cyclic_poisson needs groups (mechanism.bands) >= 1 with cohort_size x groups "
                          f"<= population; got groups={groups}, cohort {cohort_size}, population {rate_base} "
                          f"(the largest that fits: {rate_base // cohort_size})")
    return CyclicPoissonSampler(population=population, cohort=cohort_size, groups=groups, key=key,
                                **_rate_fixed(public_population))


@register_sampler(BALLS_IN_BINS, public_rate=True)
def _balls_in_bins(population, cohort_size, key, groups, public_population) -> Sampler:
    return BallsInBinsSampler(population=population, cohort=cohort_size, key=key, **_rate_fixed(public_population))


@register_sampler(B_MIN_SEP, public_rate=True)
def _b_min_sep(population, cohort_size, key, groups, public_population) -> Sampler:
    rate_base = public_population or population
    if not groups or groups < 1 or cohort_size * groups > rate_base:
        raise ConfigError(f"sampling=b_min_sep needs a separation (mechanism.bands) >= 1 with cohort_size x bands "
                          f"<= population; got {groups}, cohort {cohort_size}, population {rate_base}")
    return MinSeparationSampler(population=population, cohort=cohort_size, groups=groups, key=key,
                                **_rate_fixed(public_population))


def participations(sampler: Sampler, rounds: int) -> tuple[float, int]:
    """(the expected rounds of ``rounds`` one unit takes part in, m̄·R/N with N the rate population;
    the most the sampler's rule allows, :meth:`Sampler.participation_cap`)."""
    return sampler.expected_cohort * rounds / sampler.rate_population, sampler.participation_cap(rounds)


def participation_lines(sampler: Sampler, rounds: int, cohort_size: int) -> list[str]:
    """What ``rounds`` rounds of ``sampler`` ask of its units, from public quantities only (the
    rate population, the cohort asked for, the sampler's rule): the expected participations of a
    unit, m̄·R/N, and the most its rule allows, :meth:`Sampler.participation_cap`; then a warning
    line where the rule does not give the cohort asked for (balls-in-bins' expected cohort N/⌊N/m⌋
    off m by more than 5%) or leaves units out (cyclic: the N mod m units beyond the last block
    never take part). A plan prints them before anything runs."""
    n = sampler.rate_population
    expected, cap = participations(sampler, rounds)
    out = [f"participations: {sampler.expected_cohort:.4g} of {n} units a round over {rounds} rounds: each unit "
           f"takes part in {expected:.3g} rounds on average, at most {cap} under sampling={sampler.kind}"]
    if abs(sampler.expected_cohort - cohort_size) > 0.05 * cohort_size:
        bins = f" ({n} units in {sampler.bins} bins)" if isinstance(sampler, BallsInBinsSampler) else ""
        out.append(f"warning: sampling={sampler.kind} gives an expected cohort of {sampler.expected_cohort:.4g}, not "
                   f"cohort_size={cohort_size}{bins}")
    left_out = sampler.population - sampler.blocks * cohort_size if isinstance(sampler, CyclicSampler) else 0
    if left_out:
        out.append(f"warning: sampling={sampler.kind} cuts {n} units into blocks of {cohort_size}: the {left_out} "
                   "left over never take part")
    return out


def make_sampler(kind: str, population: int, cohort_size: int, key: bytes | None,
                 groups: int | None = None, public_population: int | None = None) -> Sampler:
    """Build the sampler named by ``kind`` with expected cohort ``cohort_size`` over the
    ``population`` units of the data (``groups``: the number of groups of ``cyclic_poisson``,
    BandMF's bands); ``key``: the run's sampling key (``RunRandomness.subkey("sampling")``), or
    None for a sampler that only states its accounting. ``public_population``: the config's
    ``population``, which fixes the Poisson-type rates (None: the rates come from ``population``,
    and are marked ``rate_from_data``); fixed-size and cyclic sampling draw from the data's units
    and take none. With a public population the cohort is checked against it alone: the data's
    own count is private there (add/remove-one), so neither a refusal nor its message depends on it."""
    if population < 1:
        raise ConfigError(f"population must be >= 1, got {population}")
    if kind not in SAMPLERS:
        raise ConfigError(f"unknown sampler {kind!r} (choose one of: {', '.join(sorted(SAMPLERS))})")
    if public_population is not None and kind not in PUBLIC_RATE_KINDS:
        raise ConfigError(f"population={public_population} fixes a Poisson sampling rate; sampling={kind} draws from "
                          "the dataset's own units (its neighbouring relation keeps their number fixed): leave "
                          "population unset (null)")
    if public_population is not None and not 1 <= cohort_size <= public_population:
        raise ConfigError(f"cohort_size {cohort_size} exceeds population={public_population}")
    if public_population is None and not 1 <= cohort_size <= population:
        raise ConfigError(f"cohort size {cohort_size} must be in [1, population={population}]")
    sampler = SAMPLERS[kind](population, cohort_size, key, groups, public_population)
    if not isinstance(sampler, Sampler):
        raise TypeError(f"the factory of sampling={kind} returned {type(sampler).__name__}, not a Sampler")
    return sampler
