"""Buffered-linear-Toeplitz (BLT) strategies: the mathematics (first step of issue 16; the
mechanism and its accounting come next).

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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from fedpriv.mechanisms.bandmf import _lbfgs, toeplitz_matrix

ERRORS = ("mean", "max")


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
    n = coefs.shape[0]
    e0 = torch.zeros(n, 1, dtype=coefs.dtype)
    e0[0] = 1.0
    first = torch.linalg.solve_triangular(toeplitz_matrix(coefs, n), e0, upper=False)[:, 0]  # C⁻¹'s column
    beta = torch.cumsum(first, 0)  # A C⁻¹ is Toeplitz with first column β
    return torch.cumsum(beta.pow(2), 0)  # row t holds β_0 … β_t


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

    best = _lbfgs(start, loss, iterations)
    params = BLTParams(best[:buffers].exp(), torch.sigmoid(best[buffers:]))
    report = {"seconds": time.perf_counter() - started,
              "rmse": rmse(params, n, participations, separation, kind)}
    return params, report
