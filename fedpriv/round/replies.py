"""What a round sends out and gets back, independent of the server state and of any transport.

A round function (:data:`RoundFn`) receives :class:`RoundInputs` — the round, its cohort, the
parameters clients start from and the round's clip bound, all it may read — and returns
:class:`Replies`: the clients' deltas (:class:`ClientReplies` of :class:`ClientUpdate`) or a sum
already clipped per unit (:class:`fedpriv.round.cohort.CohortSum`, the one-pass path). Either adds itself
to the round's aggregate through the one method :meth:`Replies.add_to`; the server never asks which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from fedpriv.round.aggregation import RoundAggregate


@dataclass(frozen=True)
class RoundInputs:
    """Everything a round function may read: round ``round_idx`` (0-based), its ``cohort`` (unit
    indices, secret: never logged), the global ``params`` clients start from (a read-only view:
    the round must not change them) and the round's user-level ``clip_norm`` (C_t)."""

    round_idx: int
    cohort: np.ndarray
    params: torch.Tensor
    clip_norm: float


class Replies(Protocol):
    """A round's answer: it adds itself to the round's aggregate."""

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        """Add the cohort's contributions (clipped to ``agg.clip_norm`` per unit) to ``agg``;
        returns the units of ``expected`` that answered and the clients' training losses
        (diagnostics only)."""
        ...


RoundFn = Callable[[RoundInputs], Replies]


@dataclass
class ClientUpdate:
    """What one client sent back; ``delta=None`` marks a malformed reply."""

    user: int
    delta: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


class ClientReplies:
    """The replies of a round's clients (what the grid returned), added in user order so the sum
    does not depend on arrival order. Users of the cohort with no reply count as dropped; replies
    from users outside the cohort, duplicates and malformed ones are rejected."""

    def __init__(self, updates: list[ClientUpdate]) -> None:
        self.updates = list(updates)

    def add_to(self, agg: RoundAggregate, expected: set[int], round_idx: int) -> tuple[set[int], list[float]]:
        seen = add_updates(agg, expected, sorted(self.updates, key=lambda u: u.user))
        return seen, [u.metrics["train_loss"] for u in self.updates if "train_loss" in u.metrics]


def add_updates(agg: RoundAggregate, expected: set[int], updates: Iterable[ClientUpdate]) -> set[int]:
    """Add ``updates`` to ``agg`` one at a time, in the order given (callers give user order);
    returns the users of ``expected`` that replied. Replies from users outside ``expected`` and
    duplicates are rejected; a malformed one (``delta=None``) is rejected but its user replied."""
    seen: set[int] = set()
    for update in updates:
        if update.user not in expected or update.user in seen:
            agg.rejected += 1
            continue
        seen.add(update.user)  # it replied: a malformed reply is rejected, not dropped
        if update.delta is None:
            agg.rejected += 1
        else:
            agg.add(update.delta)
    return seen
