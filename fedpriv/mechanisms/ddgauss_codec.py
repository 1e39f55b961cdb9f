"""The distributed discrete Gaussian's client encoding and server decoding (issue 45, first step).

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation" (ICML 2021). A client with update ``x`` ∈ R^d sends, in Z_m (m = 2^bits):

1. ``x`` clipped to L2 norm ``c`` and zero-padded to ``D`` = the next power of two ≥ d;
2. rotated, ``H·diag(s)·x`` with ``H`` the orthonormal Walsh–Hadamard matrix and ``s`` random
   signs shared by the round's clients (public randomness: the rotation flattens the vector so
   that few coordinates are large; privacy does not rest on it);
3. scaled by ``1/γ`` and rounded to the integer grid by *conditional randomized rounding*: each
   coordinate goes to ``⌊v⌋ + Bernoulli(v − ⌊v⌋)`` (unbiased), retried until the rounded vector's
   L2 norm is at most the sensitivity Δ₂ the accountant charges (:mod:`fedpriv.accounting.ddgauss`);
4. a *party* (a secure-aggregation participant: one device, or a node holding several users)
   sums its users' rounded vectors and adds one share ``N_Z(0, σ²)`` of discrete Gaussian noise
   per coordinate (σ = σ_real/γ), whether or not it holds a user this round;
5. reduced mod m. Secure aggregation reveals only ``Σ_i`` (mod m) of the parties' messages.

The server maps the sum to the centred range ``[−m/2, m/2)``, multiplies by γ and rotates back:
``Σ_i clip(x_i) + (rounding error) + γ·Σ_i noise_i``, exactly so while the centred sum does not
wrap around m. The planner (:func:`fedpriv.accounting.ddgauss.plan_ddgauss`) sizes the bits for k
standard deviations of the sum under a sub-Gaussian heuristic; a coordinate can still wrap (an
accuracy loss, not a privacy one, not detected): about d·erfc(k/√2) of them per round at the planned
size (:func:`fedpriv.accounting.ddgauss.expected_wraps`, in privacy.json).

Randomness: the rounding's and the noise's uniforms come from SHAKE-256 under the client's key
(:func:`fedpriv.keys.randomness.uniforms`), secret in secure mode; the rotation's signs from the round's
key. The discrete Gaussian is sampled as Canonne, Kamath and Steinke's "The Discrete Gaussian for
Differential Privacy" (Algorithm 3: discrete Laplace proposals of scale ⌊σ⌋+1, accepted with
probability ``exp(−(|y| − σ²/t)²/(2σ²))``), vectorized in float64: like every floating-point
sampler, its probabilities carry float rounding (the paper's exact sampler uses rationals).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedpriv.accounting.ddgauss import MAX_BITS, DistributedDiscreteGaussian, padded_dim
from fedpriv.keys.randomness import uniforms

MAX_ROUNDING_TRIES = 100  # conditional rounding fails with probability ≤ β per try (β < 1)


def hadamard(x: Tensor) -> Tensor:
    """``H x / √D`` along the last axis (D a power of two): the orthonormal fast Walsh–Hadamard
    transform, O(D log D), as in-place butterflies on a copy. It is its own inverse."""
    size = x.shape[-1]
    if size & (size - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two length, got {size}")
    y = x.reshape(-1, size).clone()
    h = 1
    while h < size:
        pairs = y.view(-1, 2, h)
        first = pairs[:, 0].clone()
        pairs[:, 0].add_(pairs[:, 1])  # a + b
        pairs[:, 1].neg_().add_(first)  # a − b
        h *= 2
    return y.div_(math.sqrt(size)).reshape(x.shape)


@functools.lru_cache(maxsize=2)
def rotation_signs(round_key: bytes, round_idx: int, size: int) -> Tensor:
    """The round's ±1 signs (float64), the same for every client of the round (cached: every
    user of a round and the decoding read them; callers must not modify the tensor)."""
    return torch.from_numpy(np.where(uniforms(round_key, "ddgauss rotation", (round_idx,), size) < 0.5, -1.0, 1.0))


def randomized_round(v: Tensor, u: np.ndarray) -> Tensor:
    """``⌊v⌋ + [u < v − ⌊v⌋]`` coordinate-wise (unbiased: E = v), as int64."""
    floor = torch.floor(v)
    return (floor + (torch.from_numpy(u) < (v - floor)).to(v.dtype)).to(torch.int64)


def conditional_round(v: Tensor, bound: float, key: bytes, index: tuple[int, ...]) -> Tensor:
    """:func:`randomized_round` retried (fresh uniforms each try) until ``‖round(v)‖₂ ≤ bound``;
    ``RuntimeError`` after :data:`MAX_ROUNDING_TRIES` (a ``bound`` below what rounding can meet)."""
    for attempt in range(MAX_ROUNDING_TRIES):
        rounded = randomized_round(v, uniforms(key, "ddgauss rounding", (*index, attempt), v.numel()))
        if float(rounded.double().pow(2).sum()) <= bound * bound:
            return rounded
    raise RuntimeError(f"conditional rounding did not meet the norm bound {bound:.4g} in {MAX_ROUNDING_TRIES} "
                       "tries: the update is not clipped to the mechanism's clip norm")


def discrete_gaussian(sigma: float, n: int, key: bytes, index: tuple[int, ...]) -> Tensor:
    """``n`` draws of ``N_Z(0, σ²)`` (int64): P(y) ∝ exp(−y²/(2σ²)) on the integers (module
    docstring: Canonne–Kamath–Steinke's Algorithm 3, vectorized)."""
    if not 0 < sigma < 2.0 ** MAX_BITS:
        raise ValueError(f"sigma must be in (0, 2^{MAX_BITS}) (float64 draws are exact integers only below 2^53), "
                         f"got {sigma}")
    t = math.floor(sigma) + 1
    log_p = -1.0 / t  # the geometric's log ratio: P(G ≥ k) = e^{−k/t}
    out: list[np.ndarray] = []
    have, batch = 0, 0
    while have < n:
        want = int(1.3 * (n - have)) + 16
        u = uniforms(key, "ddgauss noise", (*index, batch), 3 * want).reshape(3, want)
        batch += 1
        g1 = np.floor(np.log1p(-u[0]) / log_p)  # Geometric(1 − e^{−1/t}) from U ∈ [0, 1)
        g2 = np.floor(np.log1p(-u[1]) / log_p)
        y = g1 - g2  # the difference of two: discrete Laplace of scale t
        accept = u[2] < np.exp(-((np.abs(y) - sigma * sigma / t) ** 2) / (2 * sigma * sigma))
        kept = y[accept][: n - have]
        out.append(kept)
        have += len(kept)
    return torch.from_numpy(np.concatenate(out).astype(np.int64))


@dataclass(frozen=True)
class DDGaussCodec:
    """The encoding of one round's updates for :class:`DistributedDiscreteGaussian` ``mechanism``
    into Z_m, ``m = 2**bits``, and the decoding of their sum. ``mechanism.dim`` is the padded size
    (:func:`padded_dim` of the update's length)."""

    mechanism: DistributedDiscreteGaussian
    bits: int

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must be in [2, {MAX_BITS}], got {self.bits}")
        if padded_dim(self.mechanism.dim) != self.mechanism.dim:
            raise ValueError(f"the mechanism's dim must be a power of two (the padded size), got {self.mechanism.dim}")

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    def digest(self) -> str:
        """What a party checks its own codec against (it never adopts another's): the field, the
        padded dimension, the shares, and the grid step, share std, β and clip, as JSON."""
        dist = self.mechanism
        return json.dumps({"m": self.modulus, "dim": dist.dim, "shares": dist.shares, "gamma": dist.granularity,
                           "sigma": dist.local_std, "beta": dist.beta, "clip": dist.clip}, sort_keys=True)

    def matches(self, digest: str) -> bool:
        """Whether ``digest`` (another's :meth:`digest`) describes this codec: the integers equal,
        the floats equal to 1e-12 relative (two machines may round the calibration's last bit apart)."""
        try:
            other = json.loads(digest)
        except ValueError:
            return False
        mine = json.loads(self.digest())
        if not isinstance(other, dict) or set(other) != set(mine):
            return False
        return all(other[k] == mine[k] if isinstance(mine[k], int) else
                   isinstance(other[k], (int, float)) and math.isclose(other[k], mine[k], rel_tol=1e-12)
                   for k in mine)

    def rounded(self, update: Tensor, round_key: bytes, round_idx: int, key: bytes, user: int) -> Tensor:
        """One user's update on the integer grid (int64, ``dim`` coordinates): steps 1–3 of the
        module docstring — clipped to the mechanism's clip, padded, rotated by the round's signs,
        scaled by 1/γ and conditionally rounded with uniforms under ``key`` indexed by (round,
        user). ``key`` must be secret (secure mode) and not the round's public key."""
        if key == round_key:
            raise ValueError("the party's key must not be the round's public rotation key")
        mech = self.mechanism
        x = update.detach().double().flatten().cpu()
        if x.numel() > mech.dim:
            raise ValueError(f"an update of {x.numel()} coordinates does not fit the mechanism's {mech.dim}")
        norm = float(torch.linalg.vector_norm(x))
        if not math.isfinite(norm):
            raise FloatingPointError("a non-finite update cannot be encoded")
        x = x * min(1.0, mech.clip / norm) if norm > 0 else x
        padded = torch.zeros(mech.dim, dtype=torch.float64)
        padded[: x.numel()] = x
        rotated = hadamard(padded * rotation_signs(round_key, round_idx, mech.dim))
        return conditional_round(rotated / mech.granularity, mech.l2_sensitivity, key, (round_idx, user))

    def noise_share(self, key: bytes, round_idx: int, party: int) -> Tensor:
        """Party ``party``'s share ``N_Z(0, (σ/γ)²)`` per coordinate in round ``round_idx`` (int64;
        step 4), drawn under its secret ``key``."""
        mech = self.mechanism
        return discrete_gaussian(mech.local_std / mech.granularity, mech.dim, key, (round_idx, party))

    def message(self, rounded: Tensor, round_idx: int, key: bytes, party: int) -> Tensor:
        """What party ``party`` hands secure aggregation: the sum of its users' :meth:`rounded`
        updates (``rounded``, int64; zeros when it holds none) plus its :meth:`noise_share`, mod m."""
        if rounded.shape != (self.mechanism.dim,) or rounded.dtype != torch.int64:
            raise ValueError(f"a party's rounded sum is int64 of shape ({self.mechanism.dim},), got "
                             f"{rounded.dtype} {tuple(rounded.shape)}")
        return torch.remainder(rounded + self.noise_share(key, round_idx, party), self.modulus)

    def encode(self, update: Tensor, round_key: bytes, round_idx: int, key: bytes, party: int) -> Tensor:
        """A party holding the one update ``update`` (its user index = ``party``): its message."""
        return self.message(self.rounded(update, round_key, round_idx, key, party), round_idx, key, party)

    def decode(self, summed: Tensor, round_key: bytes, round_idx: int, length: int) -> Tensor:
        """Server side: the sum of the shares mod m → ``Σ clip(x_i)`` + rounding error + the
        summed noise, in update units (float64), the first ``length`` coordinates."""
        m = self.modulus
        centred = torch.remainder(summed.to(torch.int64) + m // 2, m) - m // 2
        real = hadamard(centred.double() * self.mechanism.granularity) * rotation_signs(round_key, round_idx,
                                                                                         self.mechanism.dim)
        return real[:length]
