"""Canary units: synthetic contributions whose inclusion is decided by a secret coin.

An audit of ``M`` canaries (``audit.canaries=M``) makes ``2M`` random unit directions ``u_j`` in the
model's parameter space. Canary ``j < M`` is inserted into the population when its coin says so
(probability ½); canaries ``j ≥ M`` are never inserted (the null set). An inserted canary is one
more unit of the run's sampler (:meth:`Sampler.sample_extra`: the same participation pattern a
user of the population has) and, in each round it joins, contributes ``OVERSHOOT · C · u_j`` — a
delta with no data, whose norm is past the clip bound, so the server's clipping makes it exactly
``C · u_j`` (under a plan that scales deltas before clipping, the raw delta is divided by the
scale first, so the clipped contribution is again ``C · u_j`` in the clipped space).
It enters the round's clipped sum where every unit's reply does
(:meth:`~fedpriv.round.aggregation.RoundAggregate.add`), before the mechanism's noise; for central
DP-SGD a canary unit is a gradient canary (an example whose clipped gradient contribution is
``C · u_j``), added beside Book-Keeping's clipped sum.

Scores (Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning"): the
cosine of ``u_j`` with (a) the released model's change over the run (``final``) and (b) each
round's privatized update, maximised over rounds (``max_round``). Both use released outputs only
and the canary's direction, never whether it was sampled.

Directions: ``support`` coordinates drawn without replacement (all of them when ``support`` is 0
or at least the model's size) with i.i.d. normal values, normalised — a uniformly random unit
vector of a random coordinate subspace, stored sparse so a score costs O(2M·support) per round.
All canary randomness (coins, directions, participation) comes from the run's ``audit`` subkey:
reproducible in research mode, secret in secure mode (the key lives only in the checkpoint;
directions come from a PCG64 generator seeded from that key's SHAKE-256 stream — not a CSPRNG,
but nothing written or sent holds its seed).

Privacy of real users: the canaries' material is independent of the data, so the release is the
accounted mechanism's output plus an independent term (post-processing): the ledger's claim for
real users is unchanged, and the sampler's rate and the fixed denominator stay those of the real
population. Each canary is covered by the same claim as a user, since it is sampled with the
pattern the accountant assumes and clipped to C (docs/PRIVACY.md).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.errors import ConfigError
from fedpriv.keys.randomness import keystream, uniforms

OVERSHOOT = 10.0  # a canary's raw delta has norm OVERSHOOT · C (its clipped contribution is C · u)
MAX_DENSE_VALUES = 1 << 31  # refuse 2M × support above this many stored values (8 GiB of float32 values,
# plus 16 GiB of int64 coordinates when sparse)


class CanarySet:
    """The canaries of one run: coins, directions, participation, and the running scores."""

    def __init__(self, count: int, dim: int, clip_norm: float, key: bytes, sampler, support: int = 4096) -> None:
        if count < 2:
            raise ConfigError(f"audit.canaries must be at least 2, got {count}")
        width = dim if support <= 0 or support >= dim else support
        if 2 * count * width > MAX_DENSE_VALUES:
            raise ConfigError(f"audit: {2 * count} canary directions of {width} coordinates do not fit in memory; "
                              "lower audit.support or audit.canaries")
        sampler.sample_extra(0, key, 1)  # fail closed before round 1 for a sampler that cannot take canaries
        started = time.perf_counter()
        self.count, self.dim, self.clip_norm, self.key, self.sampler = count, dim, clip_norm, key, sampler
        self.coins = uniforms(key, "audit-coin", (), count) < 0.5
        self.index, self.value = _directions(key, 2 * count, dim, width)
        self.best = torch.full((2 * count,), -float("inf"), dtype=torch.float64)  # max-round cosine so far
        self.start: torch.Tensor | None = None  # released model before round 1
        self.seconds = time.perf_counter() - started  # audit's own compute (for its cost)

    def begin(self, released: torch.Tensor) -> None:
        """Remember the released model before round 1 (once; a resumed run keeps it)."""
        if self.start is None:
            self.start = released.detach().clone()

    def participants(self, round_idx: int) -> np.ndarray:
        """The inserted canaries (coin 1) that the run's sampler lets join round ``round_idx``."""
        joined = self.sampler.sample_extra(round_idx, self.key, self.count)
        return joined[self.coins[joined]]

    def delta(self, j: int) -> torch.Tensor:
        """Canary ``j``'s raw delta: ``OVERSHOOT · C · u_j`` (dense)."""
        out = torch.zeros(self.dim)
        scale = OVERSHOOT * self.clip_norm
        if self.index is None:
            out.add_(self.value[j], alpha=scale)
        else:
            out.index_copy_(0, self.index[j], self.value[j] * scale)
        return out

    def add_to(self, agg: RoundAggregate, round_idx: int) -> None:
        """Add this round's participating canaries to the round's clipped sum (clipped there)."""
        started = time.perf_counter()
        for j in self.participants(round_idx):
            delta = self.delta(int(j))
            if agg.clip_norm != self.clip_norm:  # adaptive clipping: OVERSHOOT times this round's bound
                delta = delta * (agg.clip_norm / self.clip_norm)
            if agg.scale is not None:  # scaled before clipping (STP): its scaled norm is then OVERSHOOT · C
                delta = delta / agg.scale
            agg.add(delta, tally=False)
        self.seconds += time.perf_counter() - started

    def cosines(self, vector: torch.Tensor) -> torch.Tensor:
        """``cos(u_j, vector)`` for every canary (0 for a zero vector)."""
        norm = float(torch.linalg.vector_norm(vector))
        if not norm > 0:
            return torch.zeros(2 * self.count, dtype=torch.float64)
        v = vector.detach().to(torch.float32)
        dots = self.value @ v if self.index is None else torch.einsum("js,js->j", self.value, v[self.index])
        return dots.to(torch.float64) / norm

    def observe(self, update: torch.Tensor) -> None:
        """Fold one round's privatized update into the max-over-rounds scores."""
        started = time.perf_counter()
        self.best = torch.maximum(self.best, self.cosines(update))
        self.seconds += time.perf_counter() - started

    def scores(self, released: torch.Tensor) -> dict[str, np.ndarray]:
        """Both scores of all ``2M`` canaries: ``final`` (released model's change) and ``max_round``."""
        if self.start is None:
            raise RuntimeError("the audit never saw the model before round 1")
        started = time.perf_counter()
        final = self.cosines(released - self.start).numpy()
        self.seconds += time.perf_counter() - started
        return {"max_round": self.best.numpy().copy(), "final": final}

    def state_dict(self) -> dict:
        return {"best": self.best.clone(), "start": self.start, "seconds": self.seconds}

    def load_state_dict(self, state: dict) -> None:
        best = state["best"]
        if tuple(best.shape) != (2 * self.count,):
            raise ValueError(f"audit state holds {best.numel()} scores, expected {2 * self.count}")
        self.best = best.clone().to(torch.float64)
        self.start = None if state["start"] is None else state["start"].clone()
        self.seconds = float(state["seconds"])


def _directions(key: bytes, count: int, dim: int, width: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``count`` unit vectors: coordinates (None: all ``dim``) and values, one row per canary."""
    values = np.empty((count, width), dtype=np.float32)
    index = None if width == dim else np.empty((count, width), dtype=np.int64)
    for j in range(count):
        seed = np.frombuffer(keystream(key, "audit-direction", (j,), 32), dtype="<u8")
        rng = np.random.Generator(np.random.PCG64(seed))
        if index is not None:
            index[j] = rng.choice(dim, size=width, replace=False)
        row = rng.standard_normal(width)
        values[j] = row / np.linalg.norm(row)
    return (None if index is None else torch.from_numpy(index)), torch.from_numpy(values)
