"""Cohort samplers. Each one states the sampling that the accountant must assume.

A sampler's draw for round ``t`` depends only on ``(seed, t)``, so a resumed run draws the same
cohorts as an uninterrupted one without saving sampler state.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedpriv.errors import ConfigError

POISSON = "poisson"
FIXED_SIZE = "fixed"
CYCLIC = "cyclic"
CYCLIC_POISSON = "cyclic_poisson"


def _round_rng(seed: int, round_idx: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, stream, round_idx]))


@dataclass(frozen=True)
class PoissonSampler:
    """Each of ``population`` users joins round t independently with probability ``rate``.

    Accounting: ``PoissonSampledDpEvent(rate, ...)`` under add/remove-one neighbouring. The
    cohort size is random; aggregation divides by ``expected_cohort = rate * population``.
    """

    population: int
    rate: float
    seed: int
    kind: str = POISSON

    @property
    def expected_cohort(self) -> float:
        return self.rate * self.population

    def sample(self, round_idx: int) -> np.ndarray:
        rng = _round_rng(self.seed, round_idx, 1)
        return np.flatnonzero(rng.random(self.population) < self.rate).astype(np.int64)


class _CohortSized:
    """Samplers whose cohort size is fixed (``cohort``): rate m/N, expected cohort m."""

    cohort: int
    population: int

    @property
    def rate(self) -> float:
        return self.cohort / self.population

    @property
    def expected_cohort(self) -> float:
        return float(self.cohort)


@dataclass(frozen=True)
class FixedSizeSampler(_CohortSized):
    """Exactly ``cohort`` users drawn uniformly without replacement each round.

    Accounting: ``SampledWithoutReplacementDpEvent(population, cohort, ...)`` under the
    replace-one relation (the sum's sensitivity is then 2C).
    """

    population: int
    cohort: int
    seed: int
    kind: str = FIXED_SIZE

    def sample(self, round_idx: int) -> np.ndarray:
        rng = _round_rng(self.seed, round_idx, 2)
        return np.sort(rng.choice(self.population, size=self.cohort, replace=False)).astype(np.int64)


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, population: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([seed, 3])).permutation(population)


@dataclass(frozen=True)
class CyclicSampler(_CohortSized):
    """Epochs in a fixed order: the population is shuffled once (by ``seed``) and cut into
    ``blocks = population // cohort`` disjoint cohorts; round t takes block ``t mod blocks``.

    Participation (what tree/matrix-factorization accounting assumes): a user takes part at most
    once per ``blocks`` consecutive rounds, so at most ``⌈T/blocks⌉`` times in T rounds, with at
    least ``blocks − 1`` rounds strictly between two participations; T ≤ blocks is a single
    epoch. The ``population mod cohort`` users left over never take part. No amplification.
    """

    population: int
    cohort: int
    seed: int
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

    def sample(self, round_idx: int) -> np.ndarray:
        order = _epoch_order(self.seed, self.population)
        block = round_idx % self.blocks
        return np.sort(order[block * self.cohort:(block + 1) * self.cohort]).astype(np.int64)


@dataclass(frozen=True)
class CyclicPoissonSampler(_CohortSized):
    """b-min-separated Poisson sampling (amplified BandMF): users are split once (by ``seed``)
    into ``groups`` groups; round t Poisson-samples group ``t mod groups`` with rate
    ``group_rate = cohort · groups / population``, so the expected cohort is ``cohort``.

    Accounting: a user is eligible in ⌈T/groups⌉ rounds, each a ``PoissonSampledDpEvent(group_rate,
    ...)`` under add/remove-one; consecutive eligible rounds are ``groups`` apart.
    """

    population: int
    cohort: int
    groups: int
    seed: int
    kind: str = CYCLIC_POISSON

    @property
    def group_rate(self) -> float:
        return min(1.0, self.cohort * self.groups / self.population)

    def sample(self, round_idx: int) -> np.ndarray:
        members = np.flatnonzero(_epoch_order(self.seed, self.population) % self.groups == round_idx % self.groups)
        rng = _round_rng(self.seed, round_idx, 4)
        return np.sort(members[rng.random(len(members)) < self.group_rate]).astype(np.int64)


@dataclass(frozen=True)
class ParticipationBound:
    """A participation pattern without a sampler, for calculators: every user takes part at most
    ``participations`` times, with at least ``min_separation`` rounds strictly between two
    participations (accounted like :class:`CyclicSampler`, with no amplification)."""

    participations: int
    min_separation: int
    kind: str = CYCLIC

    def max_participations(self, rounds: int) -> int:
        return min(self.participations, -(-rounds // (self.min_separation + 1)))


Sampler = PoissonSampler | FixedSizeSampler | CyclicSampler | CyclicPoissonSampler


# sampling=auto: the sampler each mechanism is accounted with by default (amplified where possible).
DEFAULT_SAMPLING = {"gaussian": POISSON, "tree": CYCLIC, "bandmf": CYCLIC_POISSON}


def resolve_sampling(kind: str, mechanism: str) -> str:
    """``auto`` → the mechanism's default sampler (Poisson for independent noise, cyclic for the
    tree, cyclic-Poisson for BandMF); any other value is returned unchanged (and validated later)."""
    return DEFAULT_SAMPLING.get(mechanism, kind) if kind == "auto" else kind


def make_sampler(kind: str, population: int, cohort_size: int, seed: int, groups: int | None = None) -> Sampler:
    """Build the sampler named by ``kind`` with expected cohort ``cohort_size`` (``groups``: the
    number of groups of ``cyclic_poisson``, BandMF's bands)."""
    if population < 1:
        raise ConfigError(f"population must be >= 1, got {population}")
    if not 1 <= cohort_size <= population:
        raise ConfigError(f"cohort size {cohort_size} must be in [1, population={population}]")
    if kind == POISSON:
        return PoissonSampler(population=population, rate=cohort_size / population, seed=seed)
    if kind == FIXED_SIZE:
        return FixedSizeSampler(population=population, cohort=cohort_size, seed=seed)
    if kind == CYCLIC:
        return CyclicSampler(population=population, cohort=cohort_size, seed=seed)
    if kind == CYCLIC_POISSON:
        if not groups or groups < 1 or cohort_size * groups > population:
            raise ConfigError(f"sampling=cyclic_poisson needs groups (mechanism.bands) >= 1 with cohort_size x groups "
                              f"<= population; got groups={groups}, cohort {cohort_size}, population {population}")
        return CyclicPoissonSampler(population=population, cohort=cohort_size, groups=groups, seed=seed)
    raise ConfigError(f"unknown sampler {kind!r} (expected 'poisson', 'fixed', 'cyclic' or 'cyclic_poisson')")
