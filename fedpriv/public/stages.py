"""Public-data stages as hooks of the run loop, which names none of them.

A stage sees only public data and DP releases, so whatever it does is post-processing (no ledger
entry; tested). Hooks:

* ``initial_params(θ₀) → θ₀'`` — before round 1 (public pre-training, with distillation when a
  teacher exists);
* ``after_round(t, θ̂_t) → (θ' | None, fields)`` — after round t's release θ̂_t; a new θ' becomes
  the server's model through ``DPFedAvg.reset`` (which re-anchors the optimizer, e.g. FTRL's
  origin); ``fields`` join round t's metrics row (distribution-matching mid-training at T');
* ``summary(history) → dict`` — the stage's keys of summary.json.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import torch

from fedpriv.public.midtrain import check_mid_training, mid_train
from fedpriv.public.setup import PublicArtifacts, prepare_public
from fedpriv.schema import Public


class Stage(abc.ABC):  # noqa: B024 — every hook has a default: a stage overrides those it needs
    """The contract of a public-data stage (the hooks of the module docstring); every hook
    defaults to doing nothing."""

    def initial_params(self, params: torch.Tensor) -> torch.Tensor:
        return params

    def after_round(self, round_done: int, released: torch.Tensor) -> tuple[torch.Tensor | None, dict]:
        return None, {}

    def summary(self, history: list[dict]) -> dict:
        return {}


class PublicPretraining(Stage):
    """Round-0 pre-training on the public corpus (done by :func:`prepare_public`, whose model it
    hands over); its statistics go to summary.json's ``public``."""

    def __init__(self, artifacts: PublicArtifacts) -> None:
        self.artifacts = artifacts

    def initial_params(self, params: torch.Tensor) -> torch.Tensor:
        return self.artifacts.initial_params

    def summary(self, history: list[dict]) -> dict:
        return {"public": self.artifacts.stats} if self.artifacts.stats else {}


class MidTraining(Stage):
    """Distribution-matching mid-training after round T' (fedpriv/public/midtrain.py)."""

    FIELD = "distribution_matching"

    def __init__(self, task, artifacts: PublicArtifacts, at: int, public: Public, seed: int) -> None:
        self.task, self.artifacts, self.at, self.public, self.seed = task, artifacts, at, public, seed

    def after_round(self, round_done: int, released: torch.Tensor) -> tuple[torch.Tensor | None, dict]:
        if round_done != self.at:
            return None, {}
        params, stats = mid_train(self.task, self.artifacts, released, self.public, self.seed)
        return params, {self.FIELD: stats}

    def summary(self, history: list[dict]) -> dict:
        return {k: v for row in history for k, v in row.items() if k == self.FIELD}


StageBuilder = Callable[[Public, Any, PublicArtifacts, int, int], "Stage | None"]
# (public, task, artifacts, seed, rounds) -> the stage, or None when the config leaves it off
BUILDERS: list[StageBuilder] = []


def register_stage(builder: StageBuilder) -> StageBuilder:
    """Add a stage to every run (in registration order). A stage with settings of its own
    registers them as a section, ``schema.register_section(schema.Public, "<key>", Settings)``,
    read as ``public.<key>`` (typed); its module is imported by ``fedpriv/public/__init__.py``."""
    BUILDERS.append(builder)
    return builder


@register_stage
def _pretraining(public, task, artifacts, seed, rounds) -> Stage:
    return PublicPretraining(artifacts)


@register_stage
def _mid_training(public, task, artifacts, seed, rounds) -> Stage | None:
    at = check_mid_training(public, rounds)
    return None if at is None else MidTraining(task, artifacts, at, public, seed)


def build_stages(public: Public, task, seed: int, rounds: int) -> list[Stage]:
    """The registered stages the typed ``public`` section turns on, validated and built once
    (teacher and top-k corpus only when a stage uses them)."""
    check_mid_training(public, rounds)  # before the (costly) public artifacts
    artifacts = prepare_public(public, task, seed)
    stages = [stage for build in BUILDERS if (stage := build(public, task, artifacts, seed, rounds)) is not None]
    for stage in stages:
        if not isinstance(stage, Stage):
            raise TypeError(f"a registered public stage built {type(stage).__name__}, not a Stage")
    return stages
