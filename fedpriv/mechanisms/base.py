"""What every noise mechanism shares: its calibrated parameters, its noise stream (keyed by the
run key, secret in secure mode), drawing round t's noise online and in round order, its
checkpoint, and the accounting vocabulary (neighbouring relations, trivial events).

A mechanism is built once from a calibrated spec (σ known: :meth:`fedpriv.schema.MechanismOption.build`)
and then only draws. Each mechanism adds what is its own: the residual noise of round t
(``_residual``), its DpEvent for a sampler (``dp_event``, ``neighboring_relation``), its explicit
matrix for small n (``matrix``), and the extra state of a correlated stream.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import dp_accounting
import torch

from fedpriv.errors import ConfigError
from fedpriv.keys.randomness import NoiseStream

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE
ZERO_OUT = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def amplified_relation(sampler) -> dp_accounting.NeighboringRelation:
    """The relation a Poisson-type sampler (Poisson, cyclic-Poisson) is accounted under.

    Add/remove-one when its rate is a public constant (the config's ``population``, or a rate a
    calculator is given): a user added or removed changes nobody else's participation. When the
    rate comes from the dataset's own count (``rate_from_data``), one more user changes every
    user's rate, so add/remove does not hold; zero-out does — user u's data replaced by a null
    contribution, the population size fixed — and for the Poisson-sampled Gaussian its privacy
    loss pair is the add/remove pair (``N(0, σ²)`` against ``(1−q)N(0, σ²) + qN(1, σ²)``), which
    dp_accounting's REPLACE_SPECIAL accounts identically (tests/test_privacy_second_pass.py)."""
    return ZERO_OUT if getattr(sampler, "rate_from_data", False) else ADD_REMOVE


def require_noise(noise: NoiseStream | None, name: str) -> NoiseStream:
    """The mechanism's noise stream; a mechanism built for accounting only has none (fail closed)."""
    if noise is None:
        raise ValueError(f"the {name} mechanism was built for accounting only (no noise stream): it cannot add noise")
    return noise


def trivial_event(noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent | None:
    """The event when no accounting is needed: non-private (σ = 0) or nothing released yet."""
    if noise_multiplier == 0.0:
        return dp_accounting.NonPrivateDpEvent()
    if rounds == 0:
        return dp_accounting.NoOpDpEvent()
    return None


class NoiseMechanism(abc.ABC):
    """Round t's noise ``w_t = Σ_{j≤t} M[t, j] z_j`` with ``z_j ~ N(0, σ²C² I)`` the j-th draw of
    the run's noise stream and ``M`` lower triangular (the identity for independent noise).

    The contract (what the run, the ledger, calibration and the calculators rely on): the noise of
    round t (:meth:`noise`, from ``_residual``), the explicit ``M`` for small n (:meth:`matrix`),
    the DpEvent of T rounds under a sampler — at its own σ, or at the σ it would have been built
    with (``noise_multiplier=``, what calibration searches over) — with the relation it holds
    under and any detail the event alone does not say, and its checkpoint. A sampler the
    mechanism cannot account is a ``ConfigError`` from :meth:`neighboring_relation` and
    :meth:`dp_event` (fail closed)."""

    name: ClassVar[str]
    independent_noise: ClassVar[bool] = False  # z_t independent across rounds (extra queries may draw more)
    ordered: ClassVar[bool] = True  # w_t depends on earlier draws: rounds are drawn in order, and counted
    client_noise: ClassVar[bool] = False  # the parties add the noise in a secure sum; the server adds none

    def __init__(self, noise_multiplier: float, clip_norm: float, noise: NoiseStream | None = None) -> None:
        if noise_multiplier < 0:
            raise ConfigError(f"noise multiplier must be >= 0, got {noise_multiplier}")
        if clip_norm <= 0:
            raise ConfigError(f"clip norm must be > 0, got {clip_norm}")
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self._noise = noise
        self.rounds_done = 0

    @property
    def std(self) -> float:
        """Noise standard deviation per coordinate of one draw: σ·C."""
        return self.noise_multiplier * self.clip_norm

    def noise(self, round_idx: int, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """The noise of round ``round_idx`` (0-based), drawn online from the stream."""
        if self.ordered and round_idx != self.rounds_done:
            raise ValueError(f"{self.name} noise must be drawn in round order: expected round {self.rounds_done}, "
                             f"got {round_idx}")
        self._check_round(round_idx)
        shape = tuple(shape)
        if self.noise_multiplier == 0.0:
            if self.ordered:
                self.rounds_done += 1
            return torch.zeros(shape)
        stream = require_noise(self._noise, self.name)
        return self._residual(lambda: stream.normal(shape) * self.std)

    def withheld(self, shares: int | None) -> bool:
        """Whether a round whose sum holds ``shares`` parties' noise shares (None: a sum of clear
        updates) must release nothing. Server-side noise never withholds."""
        del shares
        return False

    def _check_round(self, round_idx: int) -> None:  # noqa: B027 — a hook: most mechanisms plan no round count
        """A mechanism planned for a number of rounds refuses the ones beyond it."""

    @abc.abstractmethod
    def _residual(self, draw: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``w_t`` from the stream's next draws (``draw()`` gives one ``z``); counts the round."""

    @abc.abstractmethod
    def matrix(self, rounds: int) -> torch.Tensor:
        """``M`` (float64, ``rounds × draws``): round t's noise is ``σC · (M z)_t``."""

    @abc.abstractmethod
    def neighboring_relation(self, sampler) -> dp_accounting.NeighboringRelation:
        """The relation :meth:`dp_event` holds under for ``sampler`` (``ConfigError`` if none)."""

    @abc.abstractmethod
    def dp_event(self, sampler, rounds: int, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        """The DpEvent of ``rounds`` rounds under ``sampler``, at this mechanism's σ, or at the σ
        it would have if built with ``noise_multiplier`` (calibration searches over this)."""

    @abc.abstractmethod
    def accounting_details(self, sampler, rounds: int) -> dict[str, Any]:
        """What privacy.json records beside the event (sensitivity computed, bounds used); {} if none."""

    def state_dict(self) -> dict:
        return {"name": self.name, "noise_multiplier": self.noise_multiplier, "clip_norm": self.clip_norm,
                "noise": None if self._noise is None else self._noise.state_dict()}

    def adopt_strategy(self, state: dict) -> None:
        """Take what this mechanism derives when built — an optimised strategy — from a checkpoint's
        ``state`` (:meth:`state_dict`) instead of deriving it again, so a resumed run uses exactly
        the strategy its earlier rounds used, on any machine. Call it before anything reads the
        strategy (calibration, accounting, noise). Raises ``ValueError`` for a state that does not
        fit. Mechanisms with nothing derived have nothing to adopt."""
        self._check_name(state)

    def _check_name(self, state: dict) -> None:
        """A checkpoint's mechanism state must be this mechanism's."""
        if state.get("name") != self.name:
            raise ValueError(f"checkpoint holds mechanism {state.get('name')!r}, not {self.name!r}")

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` saved (subclasses check their own keys first)."""
        self._check_name(state)
        self.noise_multiplier = float(state["noise_multiplier"])
        self.clip_norm = float(state["clip_norm"])
        if state["noise"] is not None:
            require_noise(self._noise, self.name).load_state_dict(state["noise"])
