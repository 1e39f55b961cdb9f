"""What every server optimizer offers the round: a declared query plan, a step on the round's
release, and ``reset`` (a public stage's new model). All of it is post-processing of releases."""

from __future__ import annotations

import abc

import torch

from fedpriv.round.queries import QueryPlan, RoundRelease


class ServerOptimizerBase(abc.ABC):
    """The contract of a server optimizer: its declared :attr:`query_plan` (the default: the
    privatized average delta only), a step on the round's release, ``reset`` for a model from
    outside, and its checkpoint. ``non_private_reason`` set: the run reports ε = ∞."""

    query_plan = QueryPlan()
    non_private_reason: str | None = None

    @abc.abstractmethod
    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """The next iterate from θ and the privatized average delta Δ̄ (the pseudo-gradient is −Δ̄)."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything a resumed run needs (tensors and plain values)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output."""

    def step_release(self, params: torch.Tensor, release: RoundRelease) -> tuple[torch.Tensor, dict[str, float]]:
        """One step on the round's release; returns the new iterate and quantities computed from
        the release alone (covered by the ledger)."""
        return self.step(params, release.update), {}

    def pre_clip_scale(self) -> torch.Tensor | None:
        """``s_t`` when the plan declares ``pre_clip_scale`` (computed from earlier releases only)."""
        return None

    def reset(self, params: torch.Tensor) -> None:  # noqa: B027 — a hook: most optimizers keep their state
        """A new iterate from outside (a public stage). Optimizers that read θ from the caller at
        every step keep their state; those whose iterate is a function of their state re-anchor."""
