"""Banded matrix-factorization noise (DP-BandMF, Choquette-Choo et al. 2023).

Workload: prefix sums, ``A`` = lower-triangular ones (n×n). Factor ``A = B C`` with ``C``
lower-triangular, b-banded (``C[i, j] = 0`` unless ``0 <= i − j < b``) and column-normalized
(every column has L2 norm ≤ 1). The mechanism releases ``C x + Z``; equivalently round t's sum
gets the residual noise ``w_t = (C⁻¹ Z)_t`` (``Z_t ~ N(0, σ²C_clip² I)``), so the running sum
of privatized updates carries ``B Z = A C⁻¹ Z``. ``w`` is produced online by forward
substitution, ``w_t = (Z_t − Σ_{1≤j<b} C[t, t−j] w_{t−j}) / C[t, t]``: O(b·d) memory.

Strategy optimization minimizes the mean squared prefix-sum error per unit noise,
``‖A C⁻¹‖_F² / n`` (sensitivity is 1 by normalization), over the band entries (``general``, any
n up to ~1000) or over b Toeplitz coefficients (``toeplitz``, large n: C⁻¹'s first column by one
triangular solve). Results are cached on disk (``$FEDPRIV_CACHE`` or ``~/.cache/fedpriv``),
keyed by (kind, n, b, iterations).

Sensitivity: a user taking part k times with at least b rounds between participations (b-min-
separated) touches k columns with disjoint supports, so sens² = k (checked against brute force
over participation patterns in the tests). Accounting without amplification: a Gaussian with
multiplier σ/√k; with cyclic Poisson sampling (b groups, round t Poisson-samples group t mod b):
⌈n/b⌉ × ``PoissonSampledDpEvent(p, GaussianDpEvent(σ))`` under add/remove-one. With
balls-in-bins sampling (any number of bins, any bands): one ``BallsInBinsDpEvent`` of C's first
column, accounted by Monte Carlo; C must then be Toeplitz (``strategy=toeplitz``, what ``auto``
picks for this sampler) and non-negative, as the analysis requires.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import hashlib
from collections.abc import Callable
import logging
import math
from pathlib import Path
from typing import ClassVar, Literal

import dp_accounting
import torch

from fedpriv.cache import cache_root, load_entry, save_entry
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.analysis import lbfgs_minimize, prefix_mse, toeplitz_matrix, toeplitz_prefix_column
from fedpriv.mechanisms.base import ZERO_OUT, amplified_relation, trivial_event
from fedpriv.mechanisms.streaming import CorrelatedMechanism, StreamingOperator
from fedpriv.keys.randomness import NoiseStream
from fedpriv.accounting.min_separation import MinSeparationDpEvent
from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent
from fedpriv.sampling import (CYCLIC, CYCLIC_POISSON, BallsInBinsPattern, GroupedPoissonPattern, MinSeparationPattern,
                              Sampler,
                              SeparatedPattern)
from fedpriv.schema import MechanismOption, positive, register_option

log = logging.getLogger(__name__)

KINDS = ("auto", "general", "toeplitz")
AUTO_TOEPLITZ_ABOVE = 512
CACHE_VERSION = 1


def sqrt_toeplitz_coefficients(n: int) -> torch.Tensor:
    """Coefficients of A^{1/2} (1, 1/2, 3/8, 5/16, ...): c_k = c_{k−1}·(2k−1)/(2k)."""
    out = torch.ones(n, dtype=torch.float64)
    for k in range(1, n):
        out[k] = out[k - 1] * (2 * k - 1) / (2 * k)
    return out


def band_mask(n: int, bands: int) -> torch.Tensor:
    idx = torch.arange(n)
    lag = idx[:, None] - idx[None, :]
    return (lag >= 0) & (lag < bands)


def normalize_columns(c: torch.Tensor) -> torch.Tensor:
    return c / torch.linalg.vector_norm(c, dim=0, keepdim=True)


def mean_squared_error(c: torch.Tensor) -> torch.Tensor:
    """``max_j ‖C_j‖² · ‖A C⁻¹‖_F² / n`` (prefix-sum error per unit noise times sensitivity²)."""
    c_inv = torch.linalg.solve_triangular(c, torch.eye(c.shape[0], dtype=c.dtype), upper=False)
    return torch.linalg.vector_norm(c, dim=0).max() ** 2 * prefix_mse(c_inv)


def _toeplitz_error(coefs: torch.Tensor, n: int) -> torch.Tensor:
    """Same objective for Toeplitz C (sensitivity ‖coefs‖): B = A C⁻¹ is Toeplitz too."""
    beta = toeplitz_prefix_column(coefs, n)
    weights = torch.arange(n, 0, -1, dtype=coefs.dtype)  # (n − k) copies of β_k
    return coefs.pow(2).sum() * (weights * beta.pow(2)).sum() / n


def optimize_strategy(n: int, bands: int, kind: str = "auto", iterations: int = 500) -> torch.Tensor:
    """A column-normalized, lower-triangular, ``bands``-banded C for n rounds (float64)."""
    if n < 1 or not 1 <= bands <= n:
        raise ConfigError(f"need 1 <= bands <= rounds, got bands={bands}, rounds={n}")
    if kind not in KINDS:
        raise ConfigError(f"unknown BandMF strategy kind {kind!r} (choose one of: {', '.join(KINDS)})")
    if kind == "auto":
        kind = "toeplitz" if n > AUTO_TOEPLITZ_ABOVE else "general"
    start = sqrt_toeplitz_coefficients(bands)
    if kind == "toeplitz":
        coefs = lbfgs_minimize(start, lambda x: _toeplitz_error(x, n), iterations)
        return toeplitz_matrix(coefs / torch.linalg.vector_norm(coefs), n)  # max column norm 1
    mask = band_mask(n, bands)
    init = toeplitz_matrix(start, n)[mask]

    def loss(values: torch.Tensor) -> torch.Tensor:
        c = torch.zeros(n, n, dtype=torch.float64)
        c = c.masked_scatter(mask, values)
        return mean_squared_error(normalize_columns(c))

    values = lbfgs_minimize(init, loss, iterations)
    c = torch.zeros(n, n, dtype=torch.float64).masked_scatter(mask, values)
    return normalize_columns(c)


def cache_dir() -> Path:
    return cache_root() / "bandmf"


COLUMN_NORM_TOLERANCE = 1e-9  # relative slack on "every column has norm <= 1"


def strategy_problem(c: object, n: int, bands: int) -> str | None:
    """Why ``c`` is not a strategy the accounting may rely on, or None: it must be a finite float64
    ``n × n`` matrix, lower triangular, ``bands``-banded (zero unless ``0 <= i − j < bands``), with
    every column of L2 norm ≤ 1 and a positive diagonal (so C⁻¹Z exists). The sensitivity
    ``sens² = k`` of b-min-separated participation uses exactly the band and the column norms."""
    if not isinstance(c, torch.Tensor) or c.dtype != torch.float64 or tuple(c.shape) != (n, n):
        return f"not a float64 {n}x{n} matrix"
    if not torch.isfinite(c).all():
        return "non-finite entries"
    outside = c[~band_mask(n, bands)]
    if outside.numel() and bool((outside != 0).any()):
        return f"entries outside the lower-triangular {bands}-band"
    norms = torch.linalg.vector_norm(c, dim=0)
    if bool((norms > 1.0 + COLUMN_NORM_TOLERANCE).any()):
        return f"a column of norm {float(norms.max()):.6g} > 1"
    if bool((torch.diagonal(c) <= 0).any()):
        return "a diagonal entry <= 0 (C is not invertible by forward substitution)"
    return None


def cached_strategy(n: int, bands: int, kind: str = "auto", iterations: int = 500) -> torch.Tensor:
    """:func:`optimize_strategy`, computed once per (kind, n, b, iterations) and kept on disk.

    The cache is not trusted: a stored matrix is used only if it passes :func:`strategy_problem`
    (a checksum beside it would prove nothing about its structure); otherwise it is recomputed,
    with a warning.
    """
    key = f"v{CACHE_VERSION}-{kind}-n{n}-b{bands}-it{iterations}"
    path = cache_dir() / f"{key}.pt"
    if path.exists():
        c = (load_entry(path, key) or {}).get("c")
        problem = "unreadable" if c is None else strategy_problem(c, n, bands)
        if problem is None:
            return c
        log.warning("ignoring the cached BandMF strategy %s (%s); optimizing it again", path, problem)
    c = optimize_strategy(n, bands, kind, iterations)
    problem = strategy_problem(c, n, bands)
    if problem is not None:
        raise RuntimeError(f"the optimized BandMF strategy is invalid ({problem})")
    save_entry(path, key, {"c": c})
    return c


class BandedInverseOperator(StreamingOperator):
    """Row t of ``C⁻¹Z`` online for a b-banded lower-triangular C: ``w_t = (z_t − Σ_{1≤lag<b}
    C[t, t−lag] w_{t−lag}) / C[t, t]``; state: the last b−1 residuals (rebuilt by replay on resume,
    never checkpointed). ``strategy`` gives C (lazily: accounting never needs it)."""

    def __init__(self, strategy: Callable[[], torch.Tensor], bands: int) -> None:
        self._strategy, self.bands = strategy, bands
        self._history: list[torch.Tensor] = []  # last b−1 residuals, newest last
        self.t = 0

    def next(self, draw) -> torch.Tensor:
        z = draw()
        t, c = self.t, self._strategy()
        acc = z.to(torch.float64, copy=True)  # float64 accumulation, in place: no temporary per lag
        for lag, previous in enumerate(reversed(self._history), start=1):
            coef = float(c[t, t - lag])
            if coef:
                acc.add_(previous, alpha=-coef)
        w = acc.div_(float(c[t, t])).to(z.dtype)
        self._history.append(w)
        if len(self._history) > self.bands - 1:
            self._history.pop(0)
        self.t += 1
        return w

    def fresh(self) -> "BandedInverseOperator":
        return BandedInverseOperator(self._strategy, self.bands)


class BandMFMechanism(CorrelatedMechanism):
    """BandMF residual noise ``(C⁻¹Z)_t`` with σ = ``noise_multiplier`` (std σ·C_clip per coordinate)."""

    name = "bandmf"
    independent_noise = False  # z_t correlated across rounds

    def __init__(self, noise_multiplier: float, clip_norm: float, rounds: int, bands: int,
                 noise: NoiseStream | None = None, kind: str = "auto", iterations: int = 500,
                 strategy: torch.Tensor | None = None) -> None:
        if not isinstance(bands, int) or not 1 <= bands <= rounds:
            raise ConfigError(f"mechanism.bands must be an integer in [1, rounds={rounds}], got {bands!r} "
                              f"(at most {rounds} bands fit {rounds} rounds)")
        super().__init__(noise_multiplier, clip_norm, BandedInverseOperator(lambda: self.strategy, int(bands)), noise)
        self.rounds, self.bands, self.kind, self.iterations = int(rounds), int(bands), kind, int(iterations)
        self._strategy = strategy
        self._strategy_checked = False

    @property
    def strategy(self) -> torch.Tensor:
        """The optimized C (from the disk cache, or optimized on first use; accounting needs only
        its band structure, so calculators never pay for it). A strategy given to the constructor
        is checked like a cached one (:func:`strategy_problem`): an invalid one is a ConfigError."""
        if self._strategy is None:
            self._strategy = cached_strategy(self.rounds, self.bands, self.kind, self.iterations)
        elif not self._strategy_checked:
            problem = strategy_problem(self._strategy, self.rounds, self.bands)
            if problem is not None:
                raise ConfigError(f"the BandMF strategy cannot be accounted as {self.bands}-banded with "
                                  f"unit columns: {problem}")
        self._strategy_checked = True
        return self._strategy

    def _check_round(self, round_idx: int) -> None:
        if round_idx >= self.rounds:
            raise ValueError(f"the BandMF strategy was optimized for {self.rounds} rounds")

    def adopt_strategy(self, state: dict) -> None:
        """The checkpoint's strategy (checked as a cached one is: :func:`strategy_problem`)."""
        self._check_name(state)
        if "bandmf_bands" not in state:
            return  # a checkpoint from before the strategy was kept: its digest is still checked on load
        bands = state["bandmf_bands"]
        if not isinstance(bands, torch.Tensor) or tuple(bands.shape) != (self.bands, self.rounds):
            raise ValueError("checkpoint's BandMF strategy does not fit this run's rounds and bands")
        c = torch.zeros(self.rounds, self.rounds, dtype=torch.float64)
        for k in range(self.bands):
            c += torch.diag(bands[k, k:].to(torch.float64), diagonal=-k)
        if (problem := strategy_problem(c, self.rounds, self.bands)) is not None:
            raise ValueError(f"checkpoint's BandMF strategy is not valid ({problem})")
        self._strategy, self._strategy_checked = c, True

    def matrix(self, rounds: int) -> torch.Tensor:
        """``C⁻¹`` restricted to the first ``rounds`` rounds: residual noise = C⁻¹ Z (float64)."""
        c = self.strategy[:rounds, :rounds]
        return torch.linalg.solve_triangular(c, torch.eye(rounds, dtype=torch.float64), upper=False)

    # ---------------------------------------------------------------- accounting

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        self._check_sampler(sampler)
        if isinstance(sampler, (GroupedPoissonPattern, BallsInBinsPattern, MinSeparationPattern)):
            return amplified_relation(sampler)
        return ZERO_OUT

    def _check_sampler(self, sampler: Sampler) -> None:
        if isinstance(sampler, SeparatedPattern):
            if sampler.min_separation + 1 < self.bands:
                raise ConfigError(
                    f"BandMF with {self.bands} bands needs participations at least {self.bands} rounds apart; "
                    f"sampling=cyclic gives {sampler.min_separation + 1} (population // cohort_size): "
                    f"set mechanism.bands={sampler.min_separation + 1} (the largest that fits) or a smaller cohort")
            return
        if isinstance(sampler, GroupedPoissonPattern):
            if sampler.groups != self.bands:
                raise ConfigError(f"cyclic Poisson sampling has {sampler.groups} groups but BandMF has "
                                  f"{self.bands} bands; they must be equal")
            return
        if isinstance(sampler, BallsInBinsPattern):
            return
        if isinstance(sampler, MinSeparationPattern):
            if sampler.separation < self.bands:
                raise ConfigError(f"b-min-sep sampling separates participations by {sampler.separation} rounds but "
                                  f"BandMF has {self.bands} bands; they must be equal")
            return
        raise ConfigError(f"the BandMF mechanism is accounted with sampling=cyclic (b-min-separated, no "
                          f"amplification), sampling=cyclic_poisson, sampling=balls_in_bins or sampling=b_min_sep, "
                          f"not sampling={sampler.kind}")

    def toeplitz_column(self, rounds: int) -> tuple[float, ...]:
        """C's first column over ``rounds`` rounds (its b bands), after checking that C is Toeplitz
        on them: every diagonal constant (what the balls-in-bins analysis is stated for here)."""
        c = self.strategy[:rounds, :rounds]
        column = []
        for k in range(min(self.bands, rounds)):
            diagonal = torch.diagonal(c, offset=-k)
            if not torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-12, atol=0.0):
                raise ConfigError("balls-in-bins accounting of BandMF needs a Toeplitz C: set "
                                  "mechanism.strategy=toeplitz (auto picks it for sampling=balls_in_bins)")
            column.append(float(diagonal[0]))
        return tuple(column)

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict:
        """Nothing beyond the event: it is exact for this mechanism."""
        del sampler, rounds
        return {}

    def dp_event(self, sampler: Sampler, rounds: int, noise_multiplier: float | None = None
                 ) -> dp_accounting.DpEvent:
        self._check_sampler(sampler)
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if (trivial := trivial_event(sigma, rounds)) is not None:
            return trivial
        if isinstance(sampler, BallsInBinsPattern):
            return BallsInBinsDpEvent(sigma, rounds, sampler.bins, self.toeplitz_column(rounds))
        if isinstance(sampler, MinSeparationPattern):
            return MinSeparationDpEvent(sigma, rounds, sampler.separation, sampler.probability,
                                        self.toeplitz_column(rounds))
        if isinstance(sampler, GroupedPoissonPattern):
            per_user = -(-rounds // self.bands)
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(sampler.group_rate, dp_accounting.GaussianDpEvent(sigma)),
                per_user)
        k = sampler.max_participations(rounds)
        return dp_accounting.GaussianDpEvent(sigma / math.sqrt(k))

    # ---------------------------------------------------------------- state

    def state_dict(self) -> dict:
        """The stream's state, and the strategy: its b bands (``bandmf_bands[k, t] = C[t, t−k]``),
        which a resume adopts (:meth:`adopt_strategy`), and their digest, which it checks."""
        c = self.strategy
        bands = torch.zeros(self.bands, self.rounds, dtype=torch.float64)
        for k in range(self.bands):
            bands[k, k:] = torch.diagonal(c, offset=-k)
        return {**super().state_dict(), "rounds": self.rounds, "bands": self.bands, "bandmf_bands": bands,
                "strategy_sha256": hashlib.sha256(c.numpy().tobytes()).hexdigest()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") == self.name:
            digest = hashlib.sha256(self.strategy.numpy().tobytes()).hexdigest()
            if (state["rounds"], state["bands"], state["strategy_sha256"]) != (self.rounds, self.bands, digest):
                raise ValueError("checkpoint's BandMF strategy differs from this run's (rounds, bands or matrix)")
        super().load_state_dict(state)


# --- config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class BandMFNoise(MechanismOption):
    """Banded matrix-factorization noise (sampling cyclic or cyclic_poisson)."""

    default_sampling: ClassVar[str] = CYCLIC_POISSON  # what sampling=auto picks for this mechanism
    accounting_fields: ClassVar[tuple[str, ...]] = ("bands",)
    name: str = "bandmf"
    bands: int = 16  # b: nonzero bands of the strategy; a user joins at most every b rounds
    strategy: Literal["auto", "general", "toeplitz"] = "auto"  # auto: toeplitz above 512 rounds
    iterations: int = 500  # L-BFGS iterations of the strategy optimization

    def check(self, path: str) -> None:
        positive(self, "bands", "iterations", path=path)

    def sampling_groups(self) -> int | None:
        return self.bands

    def fitted(self, population: int, cohort_size: int, rounds: int, sampling: str) -> "BandMFNoise":
        """The default 16 bands, where they do not fit: at most ``rounds``, and under cyclic or
        cyclic-Poisson sampling at most population // cohort_size (the groups, or the rounds between
        two participations, that the population allows)."""
        # balls-in-bins accounts any band count: only the rounds bound it there
        separated = (CYCLIC, CYCLIC_POISSON, "b_min_sep")
        largest = min(rounds, population // cohort_size) if sampling in separated else rounds
        if self.bands != BandMFNoise.bands or self.bands <= largest or largest < 1:
            return self
        return dataclasses.replace(self, bands=largest)

    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        if not rounds:
            raise ConfigError("the BandMF mechanism needs the number of rounds")
        kind = self.strategy
        if kind == "auto" and isinstance(sampler, (BallsInBinsPattern, MinSeparationPattern)):
            kind = "toeplitz"  # the Monte-Carlo accounting of these patterns is stated for a Toeplitz C
        return BandMFMechanism(noise_multiplier, clip_norm, rounds=int(rounds), bands=self.bands, noise=noise,
                               kind=kind, iterations=self.iterations)


register_option("mechanism", "bandmf", BandMFNoise())

