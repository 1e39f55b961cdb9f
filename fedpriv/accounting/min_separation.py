"""Monte-Carlo accounting of b-min-separated Poisson participation for a banded Toeplitz C.

The pattern (``sampling=b_min_sep``): a user is *eligible* in a round unless it took part in one of
the b − 1 rounds before; an eligible user takes part with probability p, independently (its own
coins). Started in the chain's stationary state ("warm start"): eligible with probability
π₀ = 1/(1 + (b−1)p), else waiting j ∈ {1, …, b−1} more rounds with probability p·π₀ each; every
round's expected cohort is then N·p/(1 + (b−1)p). This is the b-min-sep sampling of "Near exact
privacy amplification for matrix mechanisms" (Choquette-Choo et al.), accounted as there and in
its follow-up by Dong and Ganesh (2026): for a non-negative Toeplitz C with at most b bands, the
dominating pair is P = N(0, σ²I) against Q = E_x[N(Cx, σ²I)], x the participation indicator of
one user under the pattern. Two participations are ≥ b rounds apart and C has ≤ b bands, so
their columns of C have disjoint supports and the likelihood ratio factorises along the chain:

    Q(y)/P(y) = E_x[exp(Σ_{t: x_t = 1} a_t)],   a_t = (⟨c_t, y⟩ − ‖c_t‖²/2)/σ²,

computed by the backward recursion V_i = (1 − p)·V_{i+1} + p·e^{a_i}·V_{i+b} (V_i = 1 for
i ≥ n: the expected product from round i on, given eligibility there), and, under the warm start,
Q/P = π₀·V_0 + Σ_{j=1}^{b−1} p·π₀·V_j. Each sample costs O(n·b) (the y vector is n-dimensional),
so this pattern's calibration takes minutes where balls-in-bins' takes seconds.

The δ(ε) estimate, its bound and calibration are :mod:`fedpriv.accounting.monte_carlo`'s.
Checks (tests/test_min_separation.py): with p = 1 the pattern is balls-in-bins in b bins; with
b = 1 and C = I it is Poisson sampling at rate p, whose δ dp_accounting computes.
"""

from __future__ import annotations

import math

import attr
import numpy as np
import torch
import torch.nn.functional as F

from fedpriv.accounting.monte_carlo import (CHUNK, LossSampler, MonteCarloDpEvent, Progress, check_column,
                                            check_sigma, column_digest, generator, normals)
from fedpriv.errors import ConfigError
from fedpriv.sampling import warm_start


@attr.s(frozen=True, repr=False)
class MinSeparationDpEvent(MonteCarloDpEvent):
    """``rounds`` releases of ``C x + N(0, σ²I)`` (C lower-triangular Toeplitz, first column
    ``column`` with at most ``separation`` entries, non-negative, taken as is) under b-min-separated
    Poisson participation: ``separation`` = b, ``probability`` = p, warm start."""

    separation: int = attr.ib()
    probability: float = attr.ib()
    column: tuple[float, ...] = attr.ib(converter=lambda c: tuple(float(v) for v in c))

    def __repr__(self) -> str:
        return (f"MinSeparationDpEvent(noise_multiplier={self.noise_multiplier!r}, rounds={self.rounds}, "
                f"separation={self.separation}, probability={self.probability!r}, column=[{len(self.column)} "
                f"entries, sha256 {column_digest(self.column)[:16]}])")

    def check(self) -> None:
        if self.rounds < 1 or self.separation < 1:
            raise ConfigError(f"b-min-sep accounting needs rounds >= 1 and separation >= 1, got {self.rounds}, "
                              f"{self.separation}")
        if not 0.0 < self.probability <= 1.0:
            raise ConfigError(f"b-min-sep participation probability must be in (0, 1], got {self.probability}")
        check_column(self.column, "b-min-sep")
        if len(self.column) > self.separation:
            raise ConfigError(f"b-min-sep accounting needs C's bands ({len(self.column)}) at most the separation "
                              f"({self.separation}): two participations' columns must not overlap")
        check_sigma(self.noise_multiplier)

    def pattern(self) -> str:
        return f"b-min-sep|{self.rounds}|{self.separation}|{self.probability!r}|{column_digest(self.column)}"

    def loss_sampler(self) -> LossSampler:
        self.check()

        def sample(sigma: float, samples: int, seed: int, positive: bool,
                   progress: Progress | None = None) -> np.ndarray:
            return losses(attr.evolve(self, noise_multiplier=sigma), samples, seed, positive, progress)
        return sample


def _geometric(gen: torch.Generator, size: int, p: float) -> torch.Tensor:
    """Draws of a geometric variable on {1, 2, …} with success probability p."""
    if p >= 1.0:
        return torch.ones(size, dtype=torch.long)
    u = 1.0 - torch.rand(size, generator=gen, dtype=torch.float64)  # (0, 1]
    return (torch.floor(torch.log(u) / math.log1p(-p)) + 1).long()


def losses(event: MinSeparationDpEvent, samples: int, seed: int, positive: bool,
           progress: Progress | None = None) -> np.ndarray:
    """``samples`` draws of ``L = log Q/P`` with y from Q (``positive``) or P (module docstring);
    float64 normals (:func:`fedpriv.accounting.monte_carlo.normals`), computed in float64."""
    n, b, p, sigma = event.rounds, event.separation, float(event.probability), float(event.noise_multiplier)
    k = min(len(event.column), n)
    c = torch.tensor(event.column[:k], dtype=torch.float64)
    norms = torch.tensor([float(np.sum(np.square(event.column[:min(k, n - t)]))) for t in range(n)],
                         dtype=torch.float64)
    start_cdf = torch.from_numpy(np.cumsum(warm_start(b, p)))
    log_start = torch.from_numpy(np.log(warm_start(b, p)))
    log_p = math.log(p)
    log_q = math.log1p(-p) if p < 1 else -math.inf
    gen = generator(event, seed, int(positive))
    out = np.empty(samples)
    for begin in range(0, samples, CHUNK):
        size = min(CHUNK, samples - begin)
        y = normals(gen, (size, n)) * sigma
        if positive:
            first = torch.searchsorted(start_cdf, torch.rand(size, generator=gen, dtype=torch.float64).unsqueeze(1),
                                       right=True).squeeze(1).clamp(max=b - 1)
            x = torch.zeros((size, n), dtype=torch.float64)
            rows = torch.arange(size)
            at = first + _geometric(gen, size, p) - 1
            while bool((at < n).any()):
                inside = at < n
                x[rows[inside], at[inside]] = 1.0
                at = at + b - 1 + _geometric(gen, size, p)
            # (C x)_t = Σ_j c_j x_{t−j}
            y += F.conv1d(x.unsqueeze(1), c.flip(0).view(1, 1, k), padding=k - 1)[:, 0, :n]
        # a_t = (Σ_j c_j y_{t+j} − ‖c_t‖²/2)/σ² (columns truncated at round n)
        a = (F.conv1d(y.unsqueeze(1), c.view(1, 1, k), padding=k - 1)[:, 0, k - 1:k - 1 + n] - norms / 2) / sigma ** 2
        log_v = torch.zeros((n + b, size), dtype=torch.float64)
        a = a.T.contiguous()
        for i in range(n - 1, -1, -1):
            log_v[i] = torch.logaddexp(log_q + log_v[i + 1], log_p + a[i] + log_v[i + b])
        out[begin:begin + size] = torch.logsumexp(log_v[:b] + log_start.unsqueeze(1), dim=0).numpy()
        if progress is not None:
            progress(size)
    return out
