"""User-level DP aggregation: clip each user's delta, sum, add the mechanism's noise, divide.

For round t with cohort S_t (however it was sampled)::

    Δ̄_t = ( Σ_{u∈S_t} Δ_u · min(1, C/‖Δ_u‖₂)  +  z_t ) / D

where z_t comes from the mechanism and D is the *fixed* denominator (expected cohort size), never
the realised count — dividing by |S_t| would leak the cohort size. Non-finite deltas are rejected
(counted, never summed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def clip_factor(delta: torch.Tensor, clip_norm: float) -> tuple[float, float]:
    """``(min(1, C/‖delta‖₂), ‖delta‖₂)``: the factor that bounds the delta's L2 norm by C."""
    norm = float(torch.linalg.vector_norm(delta))
    return (clip_norm / norm if norm > clip_norm else 1.0), norm


@dataclass
class RoundAggregate:
    """Running clipped sum of one round and its bookkeeping."""

    clip_norm: float
    total: torch.Tensor
    accepted: int = 0
    rejected: int = 0
    clipped: int = 0
    norms: list[float] = field(default_factory=list)
    squares: torch.Tensor | None = None  # Σ_u clip(Δ_u)² (elementwise), when tracked
    scale: torch.Tensor | None = None  # multiply each delta by this before clipping (scale-then-privatize)
    shares: int | None = None  # a secure sum's surviving noise shares (None: clear updates were summed here)

    @classmethod
    def zeros(cls, dim: int, clip_norm: float, squares: bool = False,
              scale: torch.Tensor | None = None) -> "RoundAggregate":
        return cls(clip_norm=clip_norm, total=torch.zeros(dim), squares=torch.zeros(dim) if squares else None,
                   scale=scale)

    def beside(self, device: torch.device) -> "RoundAggregate | None":
        """An empty aggregate with this one's bound whose sum lives on ``device``, where the deltas
        were computed (:meth:`merge` it back in once): deltas clipped and summed where they are,
        no per-user copy to host memory. None where this aggregate also tracks squares or scales
        the deltas first (they are added here, in host memory)."""
        if self.squares is not None or self.scale is not None:
            return None
        return RoundAggregate(clip_norm=self.clip_norm, total=torch.zeros(self.total.shape, device=device))

    def merge(self, other: "RoundAggregate") -> None:
        """Add ``other``'s clipped sum (one copy to this sum's device) and its bookkeeping."""
        if other.squares is not None or other.scale is not None or other.clip_norm != self.clip_norm:
            raise ValueError("only an aggregate made by beside() merges back")
        self.total.add_(other.total.to(self.total.device))
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.clipped += other.clipped
        self.norms.extend(other.norms)

    def add(self, delta: torch.Tensor, tally: bool = True) -> bool:
        """Clip and add one user's delta; reject (and count) a wrong shape or non-finite values.
        ``tally=False`` (an audit's canary): clipped and added the same way, left out of the
        round's statistics (accepted, clipped, norms).

        A NaN or ±inf entry makes the L2 norm non-finite, so one pass over the delta both detects
        it and yields the clip factor (a finite delta whose norm overflows float32 is rejected too).
        """
        if delta.shape != self.total.shape:
            self.rejected += 1
            return False
        if self.scale is not None:
            delta = delta * self.scale
        factor, norm = clip_factor(delta, self.clip_norm)
        if not math.isfinite(norm):
            self.rejected += 1
            return False
        self.total.add_(delta, alpha=factor)  # fused scale-and-add: no clipped copy
        if self.squares is not None:
            self.squares.addcmul_(delta, delta, value=factor * factor)
        if not tally:
            return True
        self.accepted += 1
        self.clipped += int(norm > self.clip_norm)
        self.norms.append(norm)
        return True

    def add_clipped_sum(self, total: torch.Tensor, norms: torch.Tensor) -> None:
        """Add a sum of deltas already clipped to this aggregate's bound (e.g. by one BK pass).

        ``norms`` are the units' pre-clipping norms, one per unit in the sum; every one must be
        finite (a non-finite unit cannot be taken back out of a fused sum: fail closed).
        """
        if total.shape != self.total.shape:
            raise ValueError(f"clipped sum has shape {tuple(total.shape)}, expected {tuple(self.total.shape)}")
        if self.squares is not None or self.scale is not None:
            raise ValueError("a pre-clipped sum carries no squares and cannot be rescaled before clipping")
        if not (torch.isfinite(norms).all() and torch.isfinite(total).all()):
            raise FloatingPointError("a pre-clipped sum holds non-finite values")
        self.total.add_(total)
        self.accepted += len(norms)
        self.clipped += int((norms > self.clip_norm).sum())
        self.norms.extend(float(n) for n in norms)

    def add_secure_sum(self, total: torch.Tensor, users: int, shares: int) -> None:
        """Add a sum that secure aggregation revealed whole: ``users`` updates, each clipped to this
        aggregate's bound by its party, and ``shares`` parties' noise shares (distributed DP). The
        server sees no single update: no norm, no clipped count (:meth:`stats` reports neither)."""
        if total.shape != self.total.shape:
            raise ValueError(f"secure sum has shape {tuple(total.shape)}, expected {tuple(self.total.shape)}")
        if self.squares is not None or self.scale is not None or self.shares is not None or self.accepted:
            raise ValueError("a secure sum is the round's whole sum: no squares, no scaling, nothing else added")
        if not torch.isfinite(total).all():
            raise FloatingPointError("a decoded secure sum holds non-finite values")
        self.total.add_(total.to(self.total.dtype))
        self.accepted, self.shares = int(users), int(shares)

    def privatize(self, noise: torch.Tensor, denominator: float) -> torch.Tensor:
        """``(sum + noise) / denominator``."""
        return (self.total + noise) / denominator

    def stats(self) -> dict[str, float]:
        if self.shares is not None:  # a secure sum: its updates' norms are the parties' own
            return {"accepted": float(self.accepted), "rejected": float(self.rejected), "shares": float(self.shares)}
        return {"accepted": float(self.accepted), "rejected": float(self.rejected),
                "clipped_fraction": self.clipped / max(self.accepted, 1),
                "median_update_norm": float(torch.tensor(self.norms).median()) if self.norms else 0.0}
