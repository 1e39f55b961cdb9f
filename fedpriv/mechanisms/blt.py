"""Buffered-linear-Toeplitz (BLT) correlated noise: the strategy, its optimiser, and the
``mechanism=blt`` mechanism.

Dvijotham et al., "Efficient and Near-Optimal Noise Generation for Streaming Differential
Privacy" (2024). With ``d`` buffers, decays ``θ_i ∈ (0, 1)`` and weights ``ω_i > 0``, C is the
lower-triangular Toeplitz matrix with first column

    c_0 = 1,   c_k = Σ_i ω_i θ_i^{k−1}   (k ≥ 1).

Noise ``x = C⁻¹z`` is generated online from ``C x = z`` with ``d`` model-sized buffers:

    x_t = z_t − Σ_i ω_i b_{i,t},   b_{i,t+1} = θ_i b_{i,t} + x_t,   b_{i,0} = 0

(``b_{i,t} = Σ_{k≥1} θ_i^{k−1} x_{t−k}``), so memory is O(d·model) however long the run.

Sensitivity: with ω > 0 and θ ∈ (0, 1) the coefficients are positive and non-increasing, so the
Gram matrix CᵀC has non-negative entries that shrink as participations move apart or later; for
``k`` participations with at least ``s`` rounds strictly between two (fedpriv's separation), the
worst pattern is the earliest, ``t_j = j(s + 1)``: ``sens² = ‖Σ_j C e_{t_j}‖²`` (checked against
brute force in tests/test_blt.py). Error: mean over rounds of the prefix-sum variance,
``sens² · ‖A C⁻¹‖_F² / n``, or its max over rounds; both are minimised over (ω, θ) by L-BFGS in
float64 through the unconstrained ``log ω`` and ``logit θ``.

Why the earliest pattern is the worst: ``(CᵀC)[a, b] = Σ_{m ≤ n−1−max(a,b)} c_m c_{m+|a−b|}``;
every term is non-negative, so it grows as ``max(a, b)`` moves earlier (more terms), and since
``c_k`` is non-increasing for ``k ≥ 1`` it grows as the lag ``|a − b| ≥ 1`` shrinks (termwise). The
earliest pattern has the smallest positions and lags of any valid pattern, hence every entry of
its Gram sum dominates.

Mechanism (:class:`BLTMechanism`): the strategy is optimised once per process for the planned
rounds and the sampler's pattern over them (``mechanism.buffers``: a count, or ``auto``) — cyclic
sampling (k = ⌈T/blocks⌉ participations, blocks − 1 rounds apart), the only sampler that
guarantees one; the accounting takes the same pattern and states
``GaussianDpEvent(σ / √sens²(k, s))`` under zero-out neighbouring, for each prefix of rounds
with the prefix's own k and coefficients. Under balls-in-bins sampling (participations exactly
``bins`` rounds apart at a secret phase) the strategy is optimised for k = ⌈T/bins⌉ participations
``bins − 1`` rounds apart, and the T rounds are one ``BallsInBinsDpEvent`` of C's first column
(c_0 … c_{T−1}, taken as is), accounted by Monte Carlo: the analysis ("Near exact privacy
amplification for matrix mechanisms") covers any lower-triangular non-negative C, banded or not,
and BLT's C is non-negative (ω > 0, θ ∈ (0, 1)). Other samplers are refused.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import ClassVar, Literal, Union

import dp_accounting
import torch

from fedpriv.cache import cache_root, load_entry, save_entry
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.analysis import lbfgs_minimize, toeplitz_matrix, toeplitz_prefix_column
from fedpriv.mechanisms.base import ZERO_OUT, amplified_relation, trivial_event
from fedpriv.mechanisms.streaming import CorrelatedMechanism, StreamingOperator
from fedpriv.keys.randomness import NoiseStream
from fedpriv.accounting.monte_carlo import BallsInBinsDpEvent
from fedpriv.sampling import CYCLIC, BallsInBinsPattern, Sampler, SeparatedPattern
from fedpriv.schema import MechanismOption, positive, register_option

log = logging.getLogger(__name__)

ERRORS = ("mean", "max")
MAX_BUFFERS = 8  # auto tries 1 … this many
AUTO_GAIN = 1e-3  # auto: one more buffer must lower the RMSE by at least this fraction


@dataclass(frozen=True)
class BLTParams:
    """``d`` buffers: weights ω (positive) and decays θ (in (0, 1)), float64."""

    weights: torch.Tensor
    decays: torch.Tensor

    def __post_init__(self) -> None:
        if self.weights.shape != self.decays.shape or self.weights.dim() != 1:
            raise ValueError("BLT weights and decays must be 1-D of equal length")
        if not (bool((self.weights > 0).all()) and bool(((self.decays > 0) & (self.decays < 1)).all())):
            raise ValueError("BLT weights must be > 0 and decays in (0, 1)")

    @property
    def buffers(self) -> int:
        return self.weights.numel()

    def coefficients(self, n: int) -> torch.Tensor:
        """``c_0 … c_{n−1}``."""
        return coefficients(self.weights, self.decays, n)

    def matrix(self, n: int) -> torch.Tensor:
        """The explicit n×n C (tests, analysis)."""
        return toeplitz_matrix(self.coefficients(n), n)


def coefficients(weights: torch.Tensor, decays: torch.Tensor, n: int) -> torch.Tensor:
    """``c_0 = 1``, ``c_k = Σ_i ω_i θ_i^{k−1}`` (differentiable in both)."""
    k = torch.arange(max(n - 1, 0), dtype=weights.dtype)
    tail = (weights[None, :] * decays[None, :] ** k[:, None]).sum(1)
    return torch.cat([torch.ones(1, dtype=weights.dtype), tail])[:n]


def inverse_noise(params: BLTParams, draws: torch.Tensor) -> torch.Tensor:
    """``C⁻¹ z`` for the rows of ``draws`` [n, ...], generated online with ``d`` buffers."""
    buffers = torch.zeros((params.buffers, *draws.shape[1:]), dtype=draws.dtype)
    w = params.weights.to(draws.dtype).view(-1, *[1] * (draws.dim() - 1))
    theta = params.decays.to(draws.dtype).view_as(w)
    out = torch.empty_like(draws)
    for t in range(draws.shape[0]):
        x = draws[t] - (w * buffers).sum(0)
        buffers = theta * buffers + x
        out[t] = x
    return out


def sensitivity_sq(coefs: torch.Tensor, participations: int = 1, separation: int = 0) -> torch.Tensor:
    """``‖Σ_j C e_{j(s+1)}‖²`` for ``j < participations`` (positive non-increasing coefficients:
    the earliest pattern is the worst); differentiable in ``coefs``."""
    n, gap = coefs.shape[0], separation + 1
    column = torch.zeros_like(coefs)
    for j in range(participations):
        start = j * gap
        if start >= n:
            break
        column = column + torch.cat([coefs.new_zeros(start), coefs[:n - start]])
    return column.pow(2).sum()


def prefix_variances(coefs: torch.Tensor) -> torch.Tensor:
    """Per-round variance of the prefix-sum noise at unit noise: row norms² of ``A C⁻¹``."""
    beta = toeplitz_prefix_column(coefs, coefs.shape[0])
    return torch.cumsum(beta.pow(2), 0)  # row t of A C⁻¹ holds β_t … β_0


def error(coefs: torch.Tensor, participations: int = 1, separation: int = 0, kind: str = "mean") -> torch.Tensor:
    """``sens² · mean_t`` (or ``max_t``) of the prefix-sum variance."""
    variances = prefix_variances(coefs)
    spread = variances.mean() if kind == "mean" else variances.max()
    return sensitivity_sq(coefs, participations, separation) * spread


def rmse(params: BLTParams, n: int, participations: int = 1, separation: int = 0, kind: str = "mean") -> float:
    return math.sqrt(float(error(params.coefficients(n), participations, separation, kind)))


def optimize(n: int, buffers: int, participations: int = 1, separation: int = 0, kind: str = "mean",
             iterations: int = 300) -> tuple[BLTParams, dict]:
    """BLT parameters minimising :func:`error` for (n, k, s); returns them and a report (seconds,
    rmse). Starts from decays spread on a log scale towards 1 and equal small weights."""
    if kind not in ERRORS:
        raise ValueError(f"error must be one of {ERRORS}, got {kind!r}")
    if buffers < 1 or n < 1:
        raise ValueError("need n >= 1 and buffers >= 1")
    started = time.perf_counter()
    decays = 1.0 - torch.logspace(-0.3, -math.log10(max(n, 10)), buffers, dtype=torch.float64)
    start = torch.cat([torch.log(torch.full((buffers,), 0.5 / buffers, dtype=torch.float64)),
                       torch.logit(decays)])

    def loss(p: torch.Tensor) -> torch.Tensor:
        w, theta = p[:buffers].exp(), torch.sigmoid(p[buffers:])
        return error(coefficients(w, theta, n), participations, separation, kind)

    best = lbfgs_minimize(start, loss, iterations)
    params = BLTParams(best[:buffers].exp(), torch.sigmoid(best[buffers:]))
    report = {"seconds": time.perf_counter() - started,
              "rmse": rmse(params, n, participations, separation, kind)}
    return params, report


def optimize_auto(n: int, participations: int = 1, separation: int = 0, kind: str = "mean",
                  iterations: int = 300) -> tuple[BLTParams, dict]:
    """Buffer counts 1, 2, … up to :data:`MAX_BUFFERS`, stopping at the first that lowers the
    RMSE by less than :data:`AUTO_GAIN`: the smallest count within that of the best (every buffer
    is one more model-sized vector of state). The report's ``seconds`` covers every count tried."""
    best, seconds = None, 0.0
    for count in range(1, MAX_BUFFERS + 1):
        params, report = optimize(n, count, participations, separation, kind, iterations)
        seconds += report["seconds"]
        if best is not None and report["rmse"] > best[1]["rmse"] * (1 - AUTO_GAIN):
            break
        best = (params, {**report, "buffers": count})
    params, report = best
    return params, {**report, "seconds": seconds}


CACHE_VERSION = 1


def params_problem(entry: dict, buffers: int | None) -> str | None:
    """Why a cached entry is not a BLT strategy the accounting may rely on, or None. Any positive
    weights with decays in (0, 1) are: the sensitivity is computed from the parameters themselves
    (their c_k are positive and non-increasing, as the closed form needs)."""
    weights, decays = entry.get("weights"), entry.get("decays")
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.dim() == 1 for t in (weights, decays)):
        return "not two float64 vectors"
    if not (torch.isfinite(weights).all() and torch.isfinite(decays).all()):
        return "non-finite entries"
    if buffers is not None and weights.numel() != buffers:
        return f"{weights.numel()} buffers, not {buffers}"
    try:
        BLTParams(weights, decays)
    except ValueError as err:
        return str(err)
    return None


@functools.lru_cache(maxsize=8)
def planned_params(n: int, buffers: int | None, kind: str, iterations: int, participations: int = 1,
                   separation: int = 0) -> BLTParams:
    """The strategy a run uses: optimised for its rounds and its sampler's pattern (k participations
    at least s rounds apart; ``buffers=None``: auto), once per setting and kept on disk
    (``$FEDPRIV_CACHE/blt``), so a resumed run — on any machine or thread count — uses the very
    parameters its checkpoint holds. The cache is checked (:func:`params_problem`), not trusted."""
    key = (f"v{CACHE_VERSION}-{kind}-n{n}-d{'auto' if buffers is None else buffers}-it{iterations}"
           f"-k{participations}-s{separation}")
    path = cache_root() / "blt" / f"{key}.pt"
    if path.exists():
        entry = load_entry(path, key) or {}
        problem = "unreadable" if not entry else params_problem(entry, buffers)
        if problem is None:
            return BLTParams(entry["weights"], entry["decays"])
        log.warning("ignoring the cached BLT strategy %s (%s); optimising it again", path, problem)
    if buffers is None:
        params = optimize_auto(n, participations, separation, kind=kind, iterations=iterations)[0]
    else:
        params = optimize(n, buffers, participations, separation, kind=kind, iterations=iterations)[0]
    save_entry(path, key, {"weights": params.weights, "decays": params.decays})
    return params


def sampler_pattern(sampler: Sampler | None, rounds: int) -> tuple[int, int]:
    """``(k, s)`` of a cyclic sampler over ``rounds`` rounds; ``(1, 0)`` without one (or for a sampler
    BLT cannot be accounted with: the accounting refuses it, the strategy need not)."""
    if isinstance(sampler, BallsInBinsPattern):
        return -(-rounds // sampler.bins), sampler.bins - 1
    if not isinstance(sampler, SeparatedPattern):
        return 1, 0
    return int(sampler.max_participations(rounds)), int(sampler.min_separation)


class BLTOperator(StreamingOperator):
    """Row t of ``C⁻¹Z`` online: ``x_t = z_t − Σ_i ω_i b_i``, ``b_i ← θ_i b_i + x_t`` (float64
    buffers, one model-sized vector each; rebuilt by replay on resume, never checkpointed)."""

    def __init__(self, params) -> None:
        self._params = params  # () -> BLTParams (lazily: accounting alone never needs the buffers)
        self._buffers: torch.Tensor | None = None

    def next(self, draw) -> torch.Tensor:
        z = draw()
        p = self._params()
        if self._buffers is None:
            self._buffers = torch.zeros((p.buffers, *z.shape), dtype=torch.float64)
        x = z.to(torch.float64, copy=True)  # in place over the buffers: no buffers-sized temporary
        for weight, buffer in zip(p.weights.tolist(), self._buffers):
            x.add_(buffer, alpha=-weight)
        for decay, buffer in zip(p.decays.tolist(), self._buffers):
            buffer.mul_(decay).add_(x)
        return x.to(z.dtype)

    def fresh(self) -> "BLTOperator":
        return BLTOperator(self._params)


class BLTMechanism(CorrelatedMechanism):
    """BLT residual noise ``(C⁻¹Z)_t`` with σ = ``noise_multiplier`` (std σ·C_clip per coordinate)."""

    name = "blt"

    def __init__(self, noise_multiplier: float, clip_norm: float, rounds: int, buffers: int | None = None,
                 error_kind: str = "mean", iterations: int = 300, noise: NoiseStream | None = None,
                 params: BLTParams | None = None, sampler: Sampler | None = None) -> None:
        super().__init__(noise_multiplier, clip_norm, BLTOperator(lambda: self.params), noise)
        self.rounds, self.buffers, self.error_kind, self.iterations = int(rounds), buffers, error_kind, int(iterations)
        self.pattern = sampler_pattern(sampler, self.rounds)  # what the strategy is optimised for
        self._params = params

    @property
    def params(self) -> BLTParams:
        if self._params is None:
            self._params = planned_params(self.rounds, self.buffers, self.error_kind, self.iterations, *self.pattern)
        return self._params

    def matrix(self, rounds: int) -> torch.Tensor:
        """``C⁻¹`` for the first ``rounds`` rounds (float64), from the online operator."""
        return self.operator.matrix(rounds, max_draws=rounds)

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        self._check_sampler(sampler)
        return amplified_relation(sampler) if isinstance(sampler, BallsInBinsPattern) else ZERO_OUT

    def _check_sampler(self, sampler: Sampler) -> None:
        if not isinstance(sampler, (SeparatedPattern, BallsInBinsPattern)):
            raise ConfigError(f"the BLT mechanism is accounted with sampling=cyclic (participations a fixed number "
                              f"of rounds apart, no amplification) or sampling=balls_in_bins (Monte Carlo), "
                              f"not sampling={sampler.kind}")

    def sensitivity_sq(self, sampler: Sampler, rounds: int) -> float:
        """sens² of the first ``rounds`` rounds for the sampler's pattern (closed form)."""
        self._check_sampler(sampler)
        k = sampler.max_participations(rounds)
        return float(sensitivity_sq(self.params.coefficients(rounds), k, sampler.min_separation))

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict:
        # balls-in-bins is accounted by Monte Carlo from C itself: no closed-form sensitivity
        sens = ({} if isinstance(sampler, BallsInBinsPattern)
                else {"blt_sensitivity_sq": self.sensitivity_sq(sampler, rounds)})
        return {**sens, "blt_buffers": self.params.buffers,
                "blt_optimised_for": {"rounds": self.rounds, "participations": self.pattern[0],
                                      "min_separation": self.pattern[1], "error": self.error_kind}}

    def dp_event(self, sampler: Sampler, rounds: int, noise_multiplier: float | None = None
                 ) -> dp_accounting.DpEvent:
        self._check_sampler(sampler)
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if (trivial := trivial_event(sigma, rounds)) is not None:
            return trivial
        if isinstance(sampler, BallsInBinsPattern):
            column = tuple(float(c) for c in self.params.coefficients(rounds).tolist())
            return BallsInBinsDpEvent(sigma, rounds, sampler.bins, column)
        return dp_accounting.GaussianDpEvent(sigma / math.sqrt(self.sensitivity_sq(sampler, rounds)))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "blt_weights": self.params.weights.clone(),
                "blt_decays": self.params.decays.clone()}

    def adopt_strategy(self, state: dict) -> None:
        """The checkpoint's BLT parameters (checked as a cached entry is: :func:`params_problem`)
        instead of the cache's or a new optimisation."""
        self._check_name(state)
        entry = {"weights": state.get("blt_weights"), "decays": state.get("blt_decays")}
        if (problem := params_problem(entry, self.buffers)) is not None:
            raise ValueError(f"checkpoint's BLT parameters are not a valid strategy ({problem})")
        self._params = BLTParams(entry["weights"].clone(), entry["decays"].clone())

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") == self.name and not (torch.equal(state["blt_weights"], self.params.weights)
                                                   and torch.equal(state["blt_decays"], self.params.decays)):
            raise ValueError("checkpoint's BLT parameters differ from this run's")
        super().load_state_dict(state)


# --- config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class BLTNoise(MechanismOption):
    """Buffered-linear-Toeplitz noise (sampling cyclic)."""

    default_sampling: ClassVar[str] = CYCLIC  # what sampling=auto picks for this mechanism
    name: str = "blt"
    buffers: Union[int, Literal["auto"]] = "auto"  # model-sized buffers of noise state (auto: fewest within 0.1%)
    error: Literal["mean", "max"] = "mean"  # prefix-sum error the strategy minimises
    iterations: int = 300  # L-BFGS iterations per buffer count

    def check(self, path: str) -> None:
        positive(self, "iterations", path=path)
        if self.buffers != "auto" and not 1 <= self.buffers <= MAX_BUFFERS:
            raise ConfigError(f"{path}.buffers must be auto or an integer in [1, {MAX_BUFFERS}], got {self.buffers!r}")

    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        if not rounds:
            raise ConfigError("the BLT mechanism needs the number of rounds")
        return BLTMechanism(noise_multiplier, clip_norm, rounds=int(rounds),
                            buffers=None if self.buffers == "auto" else int(self.buffers), error_kind=self.error,
                            iterations=self.iterations, noise=noise, sampler=sampler)


register_option("mechanism", "blt", BLTNoise())
