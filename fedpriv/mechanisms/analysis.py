"""Prefix-sum error of a noise mechanism given its explicit noise matrix, and the pieces the
matrix-factorization mechanisms (BandMF, BLT) share: lower-triangular Toeplitz matrices, the
first column of ``A C⁻¹`` for a Toeplitz C, and the L-BFGS loop that optimises their strategies.

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


def toeplitz_matrix(coefs: torch.Tensor, n: int) -> torch.Tensor:
    """Lower-triangular Toeplitz n×n with first column ``coefs`` (zero beyond its length)."""
    b = len(coefs)
    idx = torch.arange(n)
    lag = idx[:, None] - idx[None, :]
    padded = torch.cat([coefs, coefs.new_zeros(max(n - b, 0) + 1)])
    return torch.where((lag >= 0) & (lag < b), padded[lag.clamp(0, len(padded) - 1)], coefs.new_zeros(()))


def toeplitz_prefix_column(coefs: torch.Tensor, n: int) -> torch.Tensor:
    """β: the first column of ``A C⁻¹`` for the n×n lower-triangular Toeplitz C with first column
    ``coefs`` (``A C⁻¹`` is Toeplitz too, so β determines it)."""
    e0 = torch.zeros(n, 1, dtype=coefs.dtype)
    e0[0] = 1.0
    first = torch.linalg.solve_triangular(toeplitz_matrix(coefs, n), e0, upper=False)[:, 0]  # first column of C⁻¹
    return torch.cumsum(first, 0)


def lbfgs_minimize(params: torch.Tensor, loss_fn, iterations: int) -> torch.Tensor:
    """``params`` minimising ``loss_fn`` (strong-Wolfe L-BFGS, at most ``iterations`` steps)."""
    params = params.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([params], lr=1.0, max_iter=iterations, history_size=50,
                            tolerance_grad=1e-12, tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_fn(params)
        loss.backward()
        return loss

    opt.step(closure)
    return params.detach()
