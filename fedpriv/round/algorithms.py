"""The training algorithms as objects: each states its privacy unit (what one sampled, clipped
contribution is), what a client computes, and — where it can — how the server side computes a
cohort's clipped sum in one batched pass. Nothing else tests an algorithm's name.

* :class:`FedAvg` — DP-FedAvg ("Learning Differentially Private Recurrent Language Models",
  McMahan et al. 2018): local epochs on each sampled user, the delta clipped to C (user level);
* :class:`ExampleLevelFedAvg` — the same with example-level DP-SGD on every client (the local
  steps run through Book-Keeping; ``fedpriv.round.local_dp`` states its accounting);
* :class:`FedSGD` — DP-FedSGD: one full-batch gradient step per user; in process, the cohort's
  clipped sum comes from one batched Book-Keeping pass (equal to the per-client loop);
* :class:`DPSGD` — central DP-SGD ("Deep Learning with Differential Privacy", Abadi et al. 2016)
  on the pooled examples: the unit is one example, sampled and clipped like a user.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
from torch import nn

from fedpriv import schema
from fedpriv.clipping import BookKeeping, UnsupportedLayerError
from fedpriv.clipping.engine import REPLAY_EVERY
from fedpriv.round.cohort import CohortClipper, CohortSum
from fedpriv.errors import ConfigError
from fedpriv.round.local_dp import resolve_example_dp
from fedpriv.round.replies import RoundInputs
from fedpriv.round.training import LocalConfig


class PooledExamples(Sequence):
    """The pooled training rows of all users, one example per unit: ``units[i]`` is row i as [1, L]."""

    def __init__(self, users: Sequence[np.ndarray]) -> None:
        self.rows = np.concatenate([np.asarray(users[u]) for u in range(len(users))])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.rows[i:i + 1]


BatchedRound = Callable[[RoundInputs], CohortSum]

#: the settings whose rounds clip per sample (Book-Keeping), named in a refusal of a model
PER_SAMPLE_SETTINGS = "client.dp=example, algorithm=dp_fedsgd and algorithm=dpsgd"


def _replay_every(client: schema.Client) -> int:
    """``client.bk_replay_every``, or Book-Keeping's default schedule where it is null."""
    return REPLAY_EVERY if client.bk_replay_every is None else client.bk_replay_every


class Algorithm:
    """One training algorithm. ``spec`` is its typed config option (``fedpriv.schema``)."""

    privacy_unit = "user"  # "user": a user's whole data is one unit; "example": one row is
    per_unit_deltas = True  # the aggregator sees each unit's delta (False: only a clipped sum)

    def __init__(self, spec: schema.Option) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def units(self, users: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        """What the server samples and clips."""
        return users

    def local_config(self, client: schema.Client, rounds: int, accountant: str) -> LocalConfig:
        """What each client runs on its unit in a round."""
        return LocalConfig(epochs=client.epochs, batch_size=client.batch_size, lr=float(client.lr),
                           max_steps=client.max_steps, replay_every=_replay_every(client), precision=client.precision)

    def per_sample_setting(self, batched: bool) -> str | None:
        """The setting that makes this algorithm clip per sample (Book-Keeping) in its clients'
        local steps (``batched`` False) or in its batched round (True), or None."""
        return None

    def check_model(self, model: nn.Module, alternative: str = "", batched: bool = False) -> None:
        """Refuse, before anything is written, a model that per-sample clipping cannot clip where
        this algorithm clips per sample (in the clients' steps, or with ``batched`` in its batched
        round): Book-Keeping's own inspection at construction (the engine is detached at once),
        the same check for the client engine, the one-pass and the central rounds.
        ``alternative``: what else the model option offers (e.g. LoRA), for the message."""
        setting = self.per_sample_setting(batched)
        if setting is None:
            return
        try:
            BookKeeping(model).detach()
        except UnsupportedLayerError as err:
            raise UnsupportedLayerError(
                f"{setting} clips per sample (as do {PER_SAMPLE_SETTINGS}), which refuses this model: {err}. "
                "What runs: algorithm=dp_fedavg with client.dp=none, or algorithm=dp_fedsgd "
                f"algorithm.one_pass=false (each user's whole update clipped, no per-sample clipping){alternative}"
            ) from None

    def check_precision(self, precision: str) -> None:
        """Refuse ``client.precision`` other than fp32 where this algorithm clips per sample (in
        the clients' steps or its batched round): Book-Keeping's checks that the model keeps
        samples apart (the separability probe, the forward replay) compare gradients at float32
        tolerance (1e-3 relative), which TF32's and bfloat16's rounding exceed. The clip itself
        would hold (fedpriv/precision.py); the checks would refuse sound models at random."""
        setting = self.per_sample_setting(False) or self.per_sample_setting(True)
        if precision != "fp32" and setting is not None:
            raise ConfigError(
                f"client.precision={precision} cannot run with per-sample clipping ({setting}): Book-Keeping's "
                "checks that the model keeps samples apart compare gradients at float32 tolerance, which "
                f"{precision} rounding exceeds; use client.precision=fp32 (DP-FedAvg's local SGD, "
                "algorithm=dp_fedavg client.dp=none, runs in any precision)")

    def client_engine(self, model: nn.Module, local: LocalConfig) -> BookKeeping | None:
        """The per-sample clipping engine hooked on the clients' model, if the local steps need one."""
        return None

    def batched_round(self, model: nn.Module, local: LocalConfig, pad_id: int,
                      units: Sequence[np.ndarray]) -> BatchedRound | None:
        """An in-process round computing the cohort's clipped sum in one batched pass over
        ``units`` with (a copy of) ``model``, or None (then each unit's delta is computed by a
        client and clipped by the aggregator)."""
        return None


class FedAvg(Algorithm):
    pass


class ExampleLevelFedAvg(FedAvg):
    """DP-FedAvg whose local steps are example-level DP-SGD (the client's replies are already
    privatized deltas; they are still clipped to C per user by the server)."""

    def per_sample_setting(self, batched: bool) -> str | None:
        return None if batched else "client.dp=example"

    def local_config(self, client: schema.Client, rounds: int, accountant: str) -> LocalConfig:
        local = super().local_config(client, rounds, accountant)
        return dataclasses.replace(local, dp=resolve_example_dp(client, rounds, accountant))

    def client_engine(self, model: nn.Module, local: LocalConfig) -> BookKeeping | None:
        dp = local.dp
        return BookKeeping(model, clip_norm=dp.clip_norm, noise_multiplier=dp.noise_multiplier, mode=dp.mode,
                           replay_every=local.replay_every)


class FedSGD(Algorithm):
    """One full-batch gradient step per unit: delta = −lr · ∇(mean token loss)."""

    @property
    def _one_pass(self) -> bool:
        return bool(getattr(self.spec, "one_pass", True))

    @property
    def per_unit_deltas(self) -> bool:  # type: ignore[override]
        return not self._one_pass

    def per_sample_setting(self, batched: bool) -> str | None:
        return f"algorithm={self.name}" if batched and self._one_pass else None

    def local_config(self, client: schema.Client, rounds: int, accountant: str) -> LocalConfig:
        return LocalConfig(epochs=1, batch_size=2**31 - 1, lr=float(client.lr), max_steps=1,
                           replay_every=_replay_every(client), precision=client.precision)

    def batched_round(self, model: nn.Module, local: LocalConfig, pad_id: int,
                      units: Sequence[np.ndarray]) -> BatchedRound | None:
        if not self._one_pass:
            return None
        replica = copy.deepcopy(model)
        clipper: CohortClipper | None = None

        def round_fn(inputs: RoundInputs) -> CohortSum:  # one full-batch step: no data order to seed
            nonlocal clipper
            if clipper is None:
                clipper = CohortClipper(replica, inputs.clip_norm, local.lr, pad_id, mode=self.spec.clipping_mode,
                                        max_rows=self.spec.max_rows, replay_every=local.replay_every,
                                        precision=local.precision)
            clipper.set_clip_norm(inputs.clip_norm)  # this round's bound (adaptive clipping: C_t)
            return clipper.clipped_sum(inputs.params, inputs.cohort, lambda u: units[u])

        return round_fn


class DPSGD(FedSGD):
    """Central DP-SGD: the units are the pooled examples (always one batched pass)."""

    privacy_unit = "example"

    @property
    def _one_pass(self) -> bool:
        return True

    def units(self, users: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        return PooledExamples(users)


@dataclass
class FedAvgOption(schema.AlgorithmOption):
    """DP-FedAvg: local epochs on each sampled user, user-level clipping of the delta."""

    algorithm_class: ClassVar[type[Algorithm]] = FedAvg
    local_training: ClassVar[bool] = True
    name: str = "dp_fedavg"

    def build(self, client: schema.Client) -> Algorithm:
        return (ExampleLevelFedAvg if client.dp == "example" else FedAvg)(self)


@dataclass
class BatchedOption(schema.AlgorithmOption):
    """The keys of the algorithms whose cohort's clipped sum comes from batched BK passes."""

    # how Book-Keeping gets per-unit norms: ghost norms, per-unit gradients, or per layer the cheaper
    clipping_mode: Literal["ghost", "instantiate", "mixopt"] = field(default="mixopt", metadata=schema.PRESENTATION)
    max_rows: int = field(default=512, metadata=schema.PRESENTATION)  # rows per batched backward (whole users)

    def check(self, path: str) -> None:
        schema.positive(self, "max_rows", path=path)


@dataclass
class FedSGDOption(BatchedOption):
    """DP-FedSGD: one full-batch gradient step per sampled user; one batched BK pass when one_pass."""

    algorithm_class: ClassVar[type[Algorithm]] = FedSGD
    name: str = "dp_fedsgd"
    one_pass: bool = field(default=True, metadata=schema.PRESENTATION)  # equals the per-client loop


@dataclass
class DPSGDOption(BatchedOption):
    """Central DP-SGD on the pooled examples (example-level accounting)."""

    algorithm_class: ClassVar[type[Algorithm]] = DPSGD
    central: ClassVar[bool] = True
    name: str = "dpsgd"


schema.register_option("algorithm", "dp_fedavg", FedAvgOption())
schema.register_option("algorithm", "dp_fedsgd", FedSGDOption())
schema.register_option("algorithm", "dpsgd", DPSGDOption())


def build_algorithm(spec: schema.RunConfig) -> Algorithm:
    """The algorithm of a run (its ``algorithm`` option, with ``client.dp`` for example-level DP)."""
    return spec.algorithm.build(spec.client)
