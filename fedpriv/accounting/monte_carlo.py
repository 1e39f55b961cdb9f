"""Monte-Carlo accounting of a Toeplitz matrix mechanism under balls-in-bins participation.

The analysis is that of "Near Exact Privacy Amplification for Matrix Mechanisms" (Choquette-Choo,
Ganesh, Haque, Steinke, Thakurta, 2024/ICLR 2025). The statement relied on: for a lower-triangular
matrix ``C`` with **non-negative** entries and balls-in-bins participation — each user assigned one
of ``b`` bins uniformly and independently, and taking part in the rounds ``t ≡ bin (mod b)`` — the
(adaptive) matrix mechanism ``C x + z``, ``z ~ N(0, σ² I_n)`` (σ multiplies the clip norm; C is
taken as is, never renormalised) is dominated, under add/remove (and zero-out) neighbouring, by
the pair

    P = N(0, σ² I_n)      Q = (1/b) Σ_s N(m_s, σ² I_n),    m_s = C x_s,

where ``x_s`` is the 0/1 indicator of the rounds of bin ``s``. Nothing in the statement needs C
banded, so a non-banded non-negative Toeplitz C (BLT) is covered as well as BandMF; independent
noise is ``C = I`` (here every ``m_s`` is ``x_s`` and the modes are orthogonal).

What is computed, and how:

* The privacy loss ``L(y) = log Q(y)/P(y) = logsumexp_s(⟨m_s, y⟩/σ² − ‖m_s‖²/(2σ²)) − log b``
  depends on ``y`` only through ``w = Mᵀy/σ²`` (``M = [m_0 … m_{b−1}]``, n×b), which under P is
  ``N(0, G/σ²)`` and under Q, given the bin ``s*``, ``N(G[:, s*]/σ², G/σ²)`` with ``G = MᵀM`` —
  so samples cost O(b²), not O(n·b), whatever the number of rounds (:func:`gram`).
* ``δ(ε) = max(E_Q[(1 − e^{ε−L})₊], E_P[(1 − e^{ε+L})₊])`` (both directions of the pair). Each
  expectation is the mean of i.i.d. terms in [0, 1]; its point estimate is the sample mean, and
  its upper bound holding with probability ≥ 1 − γ is the Chernoff–Hoeffding bound ("Probability
  inequalities for sums of bounded random variables", Hoeffding 1963: a mean of [0, 1] variables
  has the binomial's Chernoff tail): the largest μ ≥ p̂ with ``n·kl(p̂ ‖ μ) ≤ log(1/γ)``
  (:func:`kl_upper_bound`). The two directions take γ/2 each.
* ``ε(δ)`` is the smallest ε whose *upper bound* on δ(ε) is ≤ δ. The bound is non-increasing in ε,
  so ε(δ) errs (falls below the true ε at δ) only if the bound fails at that true ε: the same
  confidence holds.
* Calibration (:func:`calibrate`) searches σ over a fixed public grid (``GRID_PER_OCTAVE`` points
  per octave over [1e-6, 1e6]); every grid point is a candidate, so each claim in a calibrated run
  is made at confidence ``1 − γ/K`` with K the grid's size (Bonferroni: the σ the search settles on
  is then valid with probability ≥ 1 − γ however the search went). A claim at a σ nobody searched
  for (a fixed noise multiplier, ``epsilon``/``delta`` in the calculator) needs no correction.
  Several claims of which the smallest is reported (a run's prefix checkpoints) share γ the same way
  (:meth:`MonteCarloSettings.shared`).
* Samples come from torch's CPU generator seeded with a *public* seed and the event's pattern (never
  the run's secret keys): the accounting is reproducible, and the same samples serve every σ (common
  random numbers), so one seed gives one deterministic answer per question. The seed is not a free
  knob: seed k's claims are made at failure ``γ·w_k``, ``w_k = 6/(π²(k+1)²)`` (Σ_k w_k = 1), so the
  claim finally reported holds with probability ≥ 1 − γ even when seeds were tried until one looked
  lucky (a union bound over all seeds; seed 0 pays a factor 6/π² ≈ 0.61 in γ).
* The normals are float64 (Box–Muller on 53-bit uniforms): a coordinate's law differs from N(0, 1)
  only by the 2^-53 grid of its uniforms (radius ≤ 8.57). float32 normals (24-bit uniforms: |z| ≤
  5.77, a staircase tail) would make the bound one on δ under that law, below the pair's at small δ.
  δ below ``MIN_DELTA`` (1e-10) is refused so that the grid stays far below any δ claimed.

The claimed ε is always the upper bound, never the point estimate; both are reported.
"""

from __future__ import annotations

import hashlib
import math
import dataclasses
from dataclasses import dataclass
from typing import Callable

import attr
import dp_accounting
import numpy as np
from scipy import linalg

from fedpriv.errors import ConfigError
from fedpriv.schema.sections import MonteCarloAccounting

MC = "mc"
GRID_PER_OCTAVE = 64  # calibration's σ grid: 2^(j/64), a step of 1.09%
GRID_MIN_EXP, GRID_MAX_EXP = -20, 20  # octaves: σ in [2^-20, 2^20] ⊃ [1e-6, 1e6]
GRID_SIZE = GRID_PER_OCTAVE * (GRID_MAX_EXP - GRID_MIN_EXP) + 1
CHUNK = 1 << 15  # samples per block (a fixed size: the draws depend on it)
EPSILON_CEILING = 1e3  # an ε above this is reported as such (no finite search beyond)
MIN_DELTA = 1e-10  # the smallest δ claimed: far above the 2^-53 grid of the samples' uniforms


SAMPLES_PER_UNIT_DELTA = 50  # default samples per direction: 50/δ (the bound's floor is then ~0.3 δ)


@dataclass(frozen=True)
class MonteCarloSettings:
    """How the Monte-Carlo accountant samples: ``samples`` per direction of the dominating pair
    (None: ``SAMPLES_PER_UNIT_DELTA / δ``), ``confidence`` (1 − γ) of every claim, ``seed``
    (public) of the sample stream, charged its share :func:`seed_share` of γ, and ``candidates``:
    how many claims the confidence is shared over (the σ grid's size for a calibrated σ, times the
    prefix claims a run reports the smallest of; 1 for one σ given as is)."""

    samples: int | None = MonteCarloAccounting.samples  # the defaults are privacy.mc's (one copy)
    confidence: float = MonteCarloAccounting.confidence
    seed: int = MonteCarloAccounting.seed
    candidates: int = 1

    def __post_init__(self) -> None:
        if self.samples is not None and (not isinstance(self.samples, int) or isinstance(self.samples, bool)
                                         or self.samples < 100):
            raise ConfigError(f"Monte-Carlo samples must be an integer >= 100, got {self.samples!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ConfigError(f"Monte-Carlo confidence must be in (0, 1), got {self.confidence!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"Monte-Carlo seed must be an integer >= 0, got {self.seed!r}")
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 1:
            raise ConfigError(f"Monte-Carlo candidates must be an integer >= 1, got {self.candidates!r}")

    @staticmethod
    def of(section: MonteCarloAccounting) -> "MonteCarloSettings":
        """The settings of a run's ``privacy.mc`` section (checked there)."""
        return MonteCarloSettings(section.samples, section.confidence, section.seed)

    def count(self, delta: float) -> int:
        """Samples per direction for claims at ``delta``."""
        return self.samples if self.samples is not None else max(1000, math.ceil(SAMPLES_PER_UNIT_DELTA / delta))

    @property
    def claim_failure(self) -> float:
        """γ·w_seed/K: the probability, over the accountant's samples, that one claim is wrong."""
        return (1.0 - self.confidence) * seed_share(self.seed) / self.candidates

    def shared(self, claims: int) -> "MonteCarloSettings":
        """These settings with the confidence shared over ``claims`` times as many claims."""
        return dataclasses.replace(self, candidates=self.candidates * claims)

    def calibrated(self) -> "MonteCarloSettings":
        """These settings for claims at a σ chosen on the grid (confidence shared over it)."""
        return self.shared(GRID_SIZE)

    def describe(self, delta: float) -> dict:
        return {"samples_per_direction": self.count(delta), "confidence": self.confidence, "seed": self.seed,
                "seed_share": seed_share(self.seed), "candidates": self.candidates,
                "per_claim_failure_probability": self.claim_failure,
                "bound": "Chernoff-Hoeffding (kl) upper bound on each direction's mean, half the failure "
                         "probability each; failure (1 - confidence) * seed_share / candidates per claim"}


def seed_share(seed: int) -> float:
    """``w_k = 6/(π²(k+1)²)``: the part of γ that seed k's claims may fail with. Σ_k w_k = 1, so
    whichever seed a claim is finally reported with — chosen in advance or after trying others —
    it holds with probability ≥ 1 − γ (union bound over all seeds)."""
    return 6.0 / (math.pi ** 2 * (seed + 1) ** 2)


Progress = Callable[[int], None]  # called with the number of samples just drawn


# (σ, samples, seed, positive, progress) -> losses
LossSampler = Callable[[float, int, int, bool, "Progress | None"], np.ndarray]


@attr.s(frozen=True, repr=False)
class MonteCarloDpEvent(dp_accounting.DpEvent):
    """An event only the Monte-Carlo accountant interprets (dp_accounting's refuse it): ``rounds``
    releases at multiplier ``noise_multiplier`` under a participation pattern whose dominating
    pair's privacy loss the subclass can sample (:meth:`loss_sampler`)."""

    noise_multiplier: float = attr.ib()
    rounds: int = attr.ib()

    def check(self) -> None:
        """The conditions of the subclass's analysis; ``ConfigError`` naming the one broken."""
        raise NotImplementedError

    def pattern(self) -> str:
        """Everything but σ that the samples depend on (their public stream is keyed by it)."""
        raise NotImplementedError

    def loss_sampler(self) -> LossSampler:
        """``(σ, samples, seed, positive, progress) -> L``: draws of the privacy loss log Q/P with y
        from Q (``positive``) or P, for this pattern at any σ (what does not depend on σ prepared
        once); ``progress`` (or None) is told each chunk's size as it is drawn."""
        raise NotImplementedError


@attr.s(frozen=True, repr=False)
class BallsInBinsDpEvent(MonteCarloDpEvent):
    """``rounds`` releases of ``C x + N(0, σ²I)`` with C lower-triangular Toeplitz (first column
    ``column``, non-negative, taken as is) under balls-in-bins participation in ``bins`` bins."""

    bins: int = attr.ib()
    column: tuple[float, ...] = attr.ib(converter=lambda c: tuple(float(v) for v in c))

    def __repr__(self) -> str:
        return (f"BallsInBinsDpEvent(noise_multiplier={self.noise_multiplier!r}, rounds={self.rounds}, "
                f"bins={self.bins}, column=[{len(self.column)} entries, sha256 {column_digest(self.column)[:16]}])")

    def check(self) -> None:
        if self.rounds < 1 or self.bins < 1:
            raise ConfigError(f"balls-in-bins accounting needs rounds >= 1 and bins >= 1, got {self.rounds}, "
                              f"{self.bins}")
        check_column(self.column, "balls-in-bins")
        check_sigma(self.noise_multiplier)

    def pattern(self) -> str:
        return f"balls-in-bins|{self.rounds}|{self.bins}|{column_digest(self.column)}"

    def loss_sampler(self) -> LossSampler:
        self.check()
        pair = _Pair.of(self)

        def sample(sigma: float, samples: int, seed: int, positive: bool,
                   progress: Progress | None = None) -> np.ndarray:
            return privacy_losses(attr.evolve(self, noise_multiplier=sigma), samples, seed, positive, pair,
                                  progress)
        return sample


def column_digest(column: tuple[float, ...]) -> str:
    return hashlib.sha256(np.asarray(column, dtype=np.float64).tobytes()).hexdigest()


def check_column(column: tuple[float, ...], what: str) -> None:
    col = np.asarray(column, dtype=np.float64)
    if col.size == 0 or not np.all(np.isfinite(col)):
        raise ConfigError("the strategy column must be a non-empty list of finite numbers")
    if np.any(col < 0):
        raise ConfigError(f"{what} amplification is proven for a non-negative C only (Choquette-Choo et al., "
                          f"'Near exact privacy amplification for matrix mechanisms'); the column has "
                          f"{int(np.sum(col < 0))} negative entr(ies)")
    if col[0] <= 0:
        raise ConfigError("the strategy column's first entry (C's diagonal) must be > 0")


def check_sigma(sigma: float) -> None:
    if not sigma > 0:
        raise ConfigError(f"noise multiplier must be > 0, got {sigma}")


# ---------------------------------------------------------------- the dominating pair


def modes(column: tuple[float, ...], rounds: int, bins: int) -> np.ndarray:
    """``M`` (rounds × bins): column s is ``m_s = C x_s``. C is Toeplitz, so ``m_s`` is ``m_0``
    shifted down by s rounds (rows before s are zero)."""
    c = np.zeros(rounds)
    k = min(len(column), rounds)
    c[:k] = np.asarray(column[:k], dtype=np.float64)
    x0 = (np.arange(rounds) % bins == 0).astype(np.float64)
    first = np.convolve(c, x0)[:rounds]
    return linalg.toeplitz(first, np.zeros(bins))


def gram(column: tuple[float, ...], rounds: int, bins: int) -> np.ndarray:
    """``G = MᵀM`` (bins × bins): what the privacy loss's law depends on."""
    m = modes(column, rounds, bins)
    return m.T @ m


@dataclass(frozen=True)
class _Pair:
    """The dominating pair of one event, reduced to b dimensions: ``G``, a square root ``R``
    (``R Rᵀ = G``, from its eigendecomposition: G may be singular when some bins hold no round)."""

    g: np.ndarray
    root: np.ndarray

    @staticmethod
    def of(event: BallsInBinsDpEvent) -> "_Pair":
        g = gram(event.column, event.rounds, event.bins)
        values, vectors = np.linalg.eigh(g)
        keep = values > values.max() * 1e-12 if values.max() > 0 else values > 0
        return _Pair(g, vectors[:, keep] * np.sqrt(values[keep]))


def generator(event: MonteCarloDpEvent, seed: int, direction: int):
    """The public sample stream of one direction (a ``torch.Generator``): seeded by the settings'
    seed and the event's pattern (not σ: every σ of one calibration sees the same draws — common
    random numbers). torch's CPU generator is used for speed; these draws are public by design and
    nothing about the run's secret randomness depends on them. torch is imported here, on the
    Monte-Carlo path only (the calculator's other paths start without it)."""
    import torch  # lazy: torch on the Monte-Carlo path only (the calculator's other paths start without it)

    digest = hashlib.sha256(f"{seed}|{event.pattern()}|{direction}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def normals(gen, shape: tuple[int, ...]):
    """Standard normals as float64 from ``gen``: Box–Muller on 53-bit uniforms (module docstring;
    float32 draws would cap |z| at 5.77)."""
    import torch  # lazy: torch on the Monte-Carlo path only (the calculator's other paths start without it)

    return torch.randn(shape, generator=gen, dtype=torch.float64)



def privacy_losses(event: BallsInBinsDpEvent, samples: int, seed: int, positive: bool,
                   pair: _Pair | None = None, progress: Progress | None = None) -> np.ndarray:
    """``samples`` draws of the privacy loss ``L = log Q/P`` with y from Q
    (``positive``: the user's data present) or from P (float64 normals, computed in float64)."""
    import torch  # lazy: torch on the Monte-Carlo path only (the calculator's other paths start without it)

    event.check()
    pair = pair or _Pair.of(event)
    sigma, b = float(event.noise_multiplier), event.bins
    g = torch.from_numpy(pair.g)
    root = torch.from_numpy(pair.root)
    diagonal = bool(np.count_nonzero(pair.g - np.diag(np.diag(pair.g))) == 0)
    scale = torch.from_numpy(np.sqrt(np.diag(pair.g))) / sigma  # C = I: w's coordinates independent
    half_norms = torch.diagonal(g) / (2 * sigma * sigma)
    gen = generator(event, seed, int(positive))
    out = np.empty(samples)
    for start in range(0, samples, CHUNK):
        size = min(CHUNK, samples - start)
        if diagonal:
            w = normals(gen, (size, b)) * scale
        else:
            w = (normals(gen, (size, root.shape[1])) @ root.T) / sigma
        if positive:
            w += g[torch.randint(0, b, (size,), generator=gen)] / (sigma * sigma)
        w -= half_norms
        out[start:start + size] = (torch.logsumexp(w, dim=1) - math.log(b)).numpy()
        if progress is not None:
            progress(size)
    return out


# ---------------------------------------------------------------- δ(ε) with an upper bound


def _kl(p: float, q: float) -> float:
    """Bernoulli KL divergence kl(p ‖ q), p ≤ q < 1."""
    out = 0.0 if p <= 0 else p * math.log(p / q)
    return out + (1 - p) * math.log((1 - p) / (1 - q)) if p < 1 else out


def kl_upper_bound(mean: float, samples: int, failure: float) -> float:
    """The largest μ ≥ ``mean`` with ``samples · kl(mean ‖ μ) ≤ log(1/failure)``: an upper bound on
    the expectation of a [0, 1] variable, from the mean of ``samples`` i.i.d. draws, that fails
    with probability ≤ ``failure`` (Hoeffding 1963)."""
    mean = min(max(mean, 0.0), 1.0)
    budget = math.log(1.0 / failure) / samples
    if mean >= 1.0:
        return 1.0
    if mean <= 0.0:
        return -math.expm1(-budget)  # kl(0 ‖ μ) = −log(1 − μ)
    lo, hi = mean, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _kl(mean, mid) > budget:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * max(mid, 1e-300):
            break
    return hi


class _Direction:
    """One direction of the pair: ``δ(ε) = E[(1 − e^{ε ∓ L})₊]`` from sorted loss samples, for any
    ε in O(log n) (suffix sums of e^{−L} over the tail)."""

    def __init__(self, losses: np.ndarray, sign: float) -> None:
        # the variable whose tail counts: L for Q‖P, −L for P‖Q (terms 1 − e^{ε − v} for v > ε)
        self.v = np.sort(sign * losses)
        # log Σ_{k ≥ i} e^{−v_k}, accumulated from the top (stable for any spread of v)
        self.log_tail = np.concatenate([np.logaddexp.accumulate(-self.v[::-1])[::-1], [-np.inf]])

    def mean(self, epsilon: float) -> float:
        n = self.v.size
        i = int(np.searchsorted(self.v, epsilon, side="right"))
        count = n - i
        if count == 0:
            return 0.0
        # Σ_{v>ε} (1 − e^{ε−v}) = count − e^{ε + log Σ e^{−v}}, each term in [0, 1)
        total = count - math.exp(epsilon + self.log_tail[i])
        return min(max(total, 0.0), count) / n


@dataclass(frozen=True)
class DeltaBound:
    """δ at ``epsilon``: the point estimate and the bound claimed (max over both directions)."""

    epsilon: float
    estimate: float
    upper: float


class LossSamples:
    """The privacy-loss samples of one event under ``settings`` (``settings.count(delta)`` per
    direction, for claims at ``delta``): δ(ε) and ε(δ), point estimate and bound. ``bound_samples``
    (calibration's first search only) computes the bound as if that many samples had given the
    same mean: a projection for choosing a candidate, never a claim. ``progress`` is told the size
    of each chunk drawn (2 · samples in all)."""

    def __init__(self, event: MonteCarloDpEvent, settings: MonteCarloSettings, delta: float,
                 sampler: LossSampler | None = None, bound_samples: int | None = None,
                 progress: Progress | None = None) -> None:
        sampler = sampler or event.loss_sampler()
        self.event, self.settings, self.samples = event, settings, settings.count(delta)
        # the n of the bound: the samples drawn, or (a search's projection only) a larger count
        self.bound_samples = bound_samples or self.samples
        sigma = float(event.noise_multiplier)
        self.remove = _Direction(sampler(sigma, self.samples, settings.seed, True, progress), 1.0)
        self.add = _Direction(sampler(sigma, self.samples, settings.seed, False, progress), -1.0)

    def delta(self, epsilon: float) -> DeltaBound:
        n, failure = self.bound_samples, self.settings.claim_failure / 2
        means = (self.remove.mean(epsilon), self.add.mean(epsilon))
        return DeltaBound(epsilon, max(means), max(kl_upper_bound(m, n, failure) for m in means))

    def epsilon(self, delta: float, estimate: bool = False) -> float:
        """The smallest ε ≥ 0 whose bound on δ(ε) (``estimate``: point estimate) is ≤ ``delta``;
        ``math.inf`` if even ``EPSILON_CEILING`` does not reach it (too few samples for this δ)."""
        def value(eps: float) -> float:
            bound = self.delta(eps)
            return bound.estimate if estimate else bound.upper

        if value(0.0) <= delta:
            return 0.0
        if value(EPSILON_CEILING) > delta:
            return math.inf
        lo, hi = 0.0, 1.0
        while value(hi) > delta:
            lo, hi = hi, hi * 2
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if value(mid) <= delta:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-9 * hi:
                break
        return hi


CLAIM_FIELDS = ("epsilon", "epsilon_estimate", "delta_estimate", "delta_upper")


def claim(event: MonteCarloDpEvent, delta: float, settings: MonteCarloSettings, cached: bool = False) -> dict:
    """The claim at ``delta``: ε (the bound), its point estimate, and δ at that ε (estimate and
    bound; None where ε is infinite). ``cached``: read and write ``$FEDPRIV_CACHE/monte_carlo``
    (:func:`cache_key` with σ) — for a preview only (``python -m fedpriv.plan``): a stored claim
    cannot be checked without drawing its samples again, so the ε a run releases is never read
    from the cache."""
    check_resolvable(delta, settings)
    key = cache_key("claim", event.pattern(), delta, settings, sigma=event.noise_multiplier) if cached else None
    stored = cached_result(key) if key is not None else None
    if stored is not None and _is_claim(stored):
        return {name: stored[name] for name in CLAIM_FIELDS}
    samples = LossSamples(event, settings, delta)
    eps = samples.epsilon(delta)
    at = samples.delta(eps) if math.isfinite(eps) else None
    out = {"epsilon": eps, "epsilon_estimate": samples.epsilon(delta, estimate=True),
           "delta_estimate": None if at is None else at.estimate, "delta_upper": None if at is None else at.upper}
    if key is not None:
        store_result(key, out)
    return out


def _is_claim(stored: dict) -> bool:
    """Whether a cache entry holds a claim's fields: ε values as numbers ≥ 0 (∞ allowed), δ values
    as numbers in [0, 1] or (both, with ε infinite) None."""
    eps, est = stored.get("epsilon"), stored.get("epsilon_estimate")
    if not all(isinstance(v, float) and v >= 0 for v in (eps, est)):  # NaN fails the comparison
        return False
    deltas = [stored.get("delta_estimate"), stored.get("delta_upper")]
    if math.isinf(eps):
        return deltas == [None, None] or all(isinstance(v, float) and 0 <= v <= 1 for v in deltas)
    return all(isinstance(v, float) and 0 <= v <= 1 for v in deltas)


def min_delta_resolvable(settings: MonteCarloSettings, delta: float) -> float:
    """The smallest δ the settings (with their sample count for ``delta``) can ever claim: the
    bound when no sample exceeds ε."""
    return kl_upper_bound(0.0, settings.count(delta), settings.claim_failure / 2)


def epsilon(event: MonteCarloDpEvent, delta: float, settings: MonteCarloSettings) -> float:
    """The claimed ε at ``delta`` (the upper bound); ConfigError if the samples cannot resolve δ."""
    check_resolvable(delta, settings)
    return LossSamples(event, settings, delta).epsilon(delta)


def check_resolvable(delta: float, settings: MonteCarloSettings) -> None:
    """ConfigError if a claim at ``delta`` cannot be made: δ below ``MIN_DELTA``, or too few samples."""
    if delta < MIN_DELTA:
        raise ConfigError(f"the Monte-Carlo accountant claims delta >= {MIN_DELTA:g} only (its samples come from "
                          f"53-bit uniforms), got {delta:g}")
    floor = min_delta_resolvable(settings, delta)
    if floor >= delta:
        need = math.ceil(math.log(2.0 / settings.claim_failure) / delta)
        raise ConfigError(f"{settings.count(delta)} Monte-Carlo samples cannot bound delta={delta:g} at confidence "
                          f"{settings.confidence:g} over {settings.candidates} candidate(s) (even no loss above "
                          f"epsilon leaves a bound of {floor:.3g}): use at least ~{10 * need} samples")


# ---------------------------------------------------------------- calibration on the σ grid


def grid_sigma(j: int) -> float:
    return 2.0 ** (j / GRID_PER_OCTAVE)


def grid_index(sigma: float) -> int:
    """The smallest grid index whose σ is ≥ ``sigma``."""
    j = math.ceil(math.log2(sigma) * GRID_PER_OCTAVE - 1e-9)
    return min(max(j, GRID_MIN_EXP * GRID_PER_OCTAVE), GRID_MAX_EXP * GRID_PER_OCTAVE)


COARSE_FRACTION = 10  # calibration's first search uses 1/10 of the samples (it only proposes a candidate)
# the version of what calibrate and a claim compute from their inputs (the search, the sample stream): a
# change to either bumps it, so that no entry of the cache below outlives the code that wrote it
CACHE_VERSION = 1


def cache_key(kind: str, pattern: str, delta: float, settings: MonteCarloSettings, **more: float) -> str:
    """The key of a cached Monte-Carlo result: everything it is a function of — the event's
    pattern (rounds, bins or separation and probability, the strategy column's digest), δ, the
    samples per direction, confidence, seed and candidates, the grid, the chunk size, the sampler
    library's version (its stream), :data:`CACHE_VERSION` — and ``more`` (target ε, start, σ)."""
    import torch  # lazy: torch on the Monte-Carlo path only (the calculator's other paths start without it)

    fields = {"v": CACHE_VERSION, "kind": kind, "pattern": pattern, "delta": repr(float(delta)),
              "samples": settings.count(delta), "confidence": repr(settings.confidence), "seed": settings.seed,
              "candidates": settings.candidates, "grid": f"{GRID_PER_OCTAVE}|{GRID_MIN_EXP}|{GRID_MAX_EXP}",
              "chunk": CHUNK, "coarse": COARSE_FRACTION, "torch": torch.__version__,
              **{name: repr(float(value)) for name, value in sorted(more.items())}}
    return "|".join(f"{name}={value}" for name, value in fields.items())


def _cache_path(key: str):
    from fedpriv.cache import cache_root  # lazy: fedpriv.cache imports torch (the calculator's other paths don't)

    return cache_root() / "monte_carlo" / f"{hashlib.sha256(key.encode()).hexdigest()}.pt"


def cached_result(key: str) -> dict | None:
    """The entry stored under ``key`` (None: none, unreadable, or another key's). Plain data only;
    the caller checks its values."""
    from fedpriv.cache import load_entry  # lazy: fedpriv.cache imports torch (the calculator's other paths don't)

    return load_entry(_cache_path(key), key)


def store_result(key: str, entry: dict) -> None:
    """Store ``entry`` under ``key``; a cache that cannot be written is skipped (it only saves time)."""
    from fedpriv.cache import save_entry  # lazy: fedpriv.cache imports torch (the calculator's other paths don't)

    try:
        save_entry(_cache_path(key), key, entry)
    except OSError:
        pass


def _cached_sigma(key: str) -> float | None:
    """A cached calibration's σ if it is one calibrate can return (a finite grid point), else None."""
    sigma = (cached_result(key) or {}).get("sigma")
    if isinstance(sigma, float) and math.isfinite(sigma) and sigma > 0 and grid_sigma(grid_index(sigma)) == sigma:
        return sigma
    return None


def calibrate(make_event: Callable[[float], MonteCarloDpEvent], target_epsilon: float, delta: float,
              settings: MonteCarloSettings, start: float = 1.0, progress: Progress | None = None) -> float:
    """The smallest grid σ (to the search's resolution) whose claimed ε at ``delta`` — the bound,
    at the grid-corrected confidence (``settings.calibrated()``) — is ≤ ``target_epsilon``.

    Two searches, each bracketing then bisecting over grid indices: the first, on a tenth of the
    samples, only proposes a candidate (its δ estimate with the full sample count's bound); the
    second walks from it on the full samples. Only full-sample checks decide what is returned, and
    every grid point is a candidate the confidence is shared over, so the returned σ's claim holds
    with probability ≥ ``settings.confidence`` however either search went (module docstring). The
    searches assume the claim is monotone in σ only for optimality, not for validity. ``progress``:
    as :class:`LossSamples`'s, for every σ tried.

    Cached (``$FEDPRIV_CACHE/monte_carlo``, :func:`cache_key`: the pattern, ε, δ, the settings,
    ``start``): the search is deterministic given these public inputs (a public seed, common random
    numbers), so a stored σ is the one a search would return again; an entry that is unreadable,
    another key's or not a grid σ is recomputed. A σ too small for its target cannot pass unseen:
    a run's ledger claims ε at it on its own samples and refuses a claim above the target."""
    settings = settings.calibrated()
    check_resolvable(delta, settings)
    event = make_event(1.0)
    event.check()  # the analysis' conditions, hit or miss
    key = cache_key("calibrate", event.pattern(), delta, settings, epsilon=target_epsilon, start=start)
    cached = _cached_sigma(key)
    if cached is not None:
        return cached
    sigma = _search(make_event, event, target_epsilon, delta, settings, start, progress)
    store_result(key, {"sigma": sigma})
    return sigma


def _search(make_event: Callable[[float], MonteCarloDpEvent], event: MonteCarloDpEvent, target_epsilon: float,
            delta: float, settings: MonteCarloSettings, start: float, progress: Progress | None) -> float:
    """:func:`calibrate`'s two searches (its docstring), at the grid-corrected ``settings``."""
    sampler = event.loss_sampler()  # what does not depend on σ, prepared once
    full = settings.count(delta)
    coarse = dataclasses.replace(settings, samples=max(1000, full // COARSE_FRACTION))

    def claim_fits(chosen: MonteCarloSettings) -> Callable[[int], bool]:
        memo: dict[int, bool] = {}

        def fits(j: int) -> bool:
            if j not in memo:
                samples = LossSamples(make_event(grid_sigma(j)), chosen, delta, sampler, bound_samples=full,
                                      progress=progress)
                memo[j] = samples.epsilon(delta) <= target_epsilon
            return memo[j]
        return fits

    proposed = _smallest_fitting(claim_fits(coarse), grid_index(start), 8, target_epsilon, delta)
    return grid_sigma(_smallest_fitting(claim_fits(settings), proposed, 1, target_epsilon, delta))


def _smallest_fitting(fits: Callable[[int], bool], j: int, step: int, target_epsilon: float, delta: float) -> int:
    """The smallest grid index j with ``fits(j)`` (assuming monotone), by bracketing from ``j`` with
    steps ``step``, 2·step, … and bisecting; ConfigError if even the largest grid σ does not fit."""
    lo_limit, hi_limit = GRID_MIN_EXP * GRID_PER_OCTAVE, GRID_MAX_EXP * GRID_PER_OCTAVE
    j = min(max(j, lo_limit), hi_limit)
    if fits(j):
        hi = j
        while hi - step >= lo_limit and fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(hi - step, lo_limit - 1)
    else:
        lo = j
        while True:
            if lo + step > hi_limit:
                if fits(hi_limit):
                    hi = hi_limit
                    break
                raise ConfigError(f"target epsilon {target_epsilon} at delta {delta} is unreachable with the "
                                  f"Monte-Carlo accountant even at noise multiplier {grid_sigma(hi_limit):g}")
            if fits(lo + step):
                hi = lo + step
                break
            lo, step = lo + step, step * 2
    while hi - lo > 1:  # fits(hi), not fits(lo) (or lo below the grid)
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi
