"""One streaming interface for correlated noise: a lower-triangular operator applied online.

Round t's residual noise is ``w_t = Σ_{j ≤ t} M[t, j] z_j`` — ``z_j`` the stream's unit draws
(times σC) in order, ``M`` lower triangular in the order of draws — computed one round at a
time from a bounded state (the style of jax_privacy's streaming matrices). Tree aggregation
("Practical and Private (Deep) Learning without Sampling or Shuffling", Kairouz et al. 2021)
and banded matrix factorization ("(Amplified) Banded Matrix Factorization", Choquette-Choo et al.
2023) are two such operators; a new one (BLT) is a subclass with its own ``next`` and state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedpriv.mechanisms.base import NoiseMechanism
from fedpriv.keys.randomness import NoiseStream

Draw = Callable[[], torch.Tensor]


class StreamingOperator:
    """``next(draw)`` consumes the round's fresh draws (``draw()`` returns the next ``z``; an
    operator may take several per round, the tree one per completed node) and returns ``w_t``."""

    def next(self, draw: Draw) -> torch.Tensor:
        raise NotImplementedError

    def fresh(self) -> "StreamingOperator":
        """The same operator with no round consumed yet (for :meth:`matrix`)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def matrix(self, rounds: int, max_draws: int | None = None) -> torch.Tensor:
        """``M`` [rounds, draws used], float64, by feeding unit vectors through a fresh operator."""
        probe = self.fresh()
        size = max_draws or 2 * rounds + 1
        draws = iter(torch.eye(size, dtype=torch.float64))
        out = torch.stack([probe.next(lambda: next(draws).clone()) for _ in range(rounds)])
        used = int(torch.nonzero(out.abs().sum(0)).max()) + 1 if out.abs().sum() > 0 else 0
        return out[:, :used]


class CorrelatedMechanism(NoiseMechanism):
    """A mechanism whose noise is a :class:`StreamingOperator` on the run's noise stream."""

    independent_noise = False

    def __init__(self, noise_multiplier: float, clip_norm: float, operator: StreamingOperator,
                 noise: NoiseStream | None = None) -> None:
        super().__init__(noise_multiplier, clip_norm, noise)
        self.operator = operator

    def _residual(self, draw: Draw) -> torch.Tensor:
        w = self.operator.next(draw)
        self.rounds_done += 1
        return w

    def matrix(self, rounds: int) -> torch.Tensor:
        return self.operator.matrix(rounds)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.operator.state_dict(), "rounds_done": self.rounds_done}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.operator.load_state_dict(state)
        self.rounds_done = int(state["rounds_done"])
