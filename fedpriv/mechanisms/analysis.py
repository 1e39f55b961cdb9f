"""Prefix-sum error of a noise mechanism given its explicit noise matrix.

``matrix`` M [n, draws]: round t's residual noise is Σ_j M[t, j] z_j with unit Gaussian draws, so
the noise of the prefix sum after round t is row t of ``cumsum(M, 0)`` (for matrix factorization
M = C⁻¹ and cumsum(M) = A C⁻¹ = B).
"""

from __future__ import annotations

import math

import torch


def prefix_mse(matrix: torch.Tensor) -> torch.Tensor:
    """Mean over rounds of the prefix-sum noise variance at unit noise multiplier (differentiable)."""
    return torch.cumsum(matrix, dim=0).pow(2).sum() / matrix.shape[0]


def prefix_rmse(matrix: torch.Tensor, sens_sq: float) -> float:
    """``sqrt(sens² · mean_t Var(prefix noise_t))`` (KNOWN_ANSWERS.md definition)."""
    return math.sqrt(sens_sq * float(prefix_mse(matrix)))
