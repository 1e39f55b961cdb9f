"""What every server optimizer offers the round: a declared query plan, a step on the round's
release, and ``reset`` (a public stage's new model). All of it is post-processing of releases."""

from __future__ import annotations

import torch

from fedpriv.queries import QueryPlan, RoundRelease


class ServerOptimizerBase:
    """Consumes the privatized average delta only (the default plan)."""

    query_plan = QueryPlan()
    non_private_reason: str | None = None

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_release(self, params: torch.Tensor, release: RoundRelease) -> tuple[torch.Tensor, dict[str, float]]:
        """One step on the round's release; returns the new iterate and quantities computed from
        the release alone (covered by the ledger)."""
        return self.step(params, release.update), {}

    def pre_clip_scale(self) -> torch.Tensor | None:
        """``s_t`` when the plan declares ``pre_clip_scale`` (computed from earlier releases only)."""
        return None

    def reset(self, params: torch.Tensor) -> None:
        """A new iterate from outside (a public stage). Optimizers that read θ from the caller at
        every step keep their state; those whose iterate is a function of their state re-anchor."""
