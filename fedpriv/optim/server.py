"""Server optimizers. They consume the privatized average delta Δ̄_t (post-processing, so any
optimizer keeps the DP guarantee) and treat ``g_t = −Δ̄_t`` as the pseudo-gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Literal

import torch

from fedpriv.errors import ConfigError
from fedpriv.optim.adaptive import ADAPTIVE_NAMES, DPAdaptive  # noqa: F401 (re-exported)
from fedpriv.optim.base import ServerOptimizerBase
from fedpriv.schema import OptimizerOption, in_unit_interval, load, positive, register_option


def cosine_factor(step: int, total_steps: int | None) -> float:
    """Learning-rate factor ``(1 + cos(π·step/total))/2`` of step ``step`` (0-based); 1 without a total."""
    if not total_steps:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))


class ServerSGD(ServerOptimizerBase):
    """``m ← β m + Δ̄``; ``θ ← θ + η_t m`` (β = 0: plain FedAvg with server learning rate η).

    With ``decay_steps`` the rate follows a cosine decay ``η_t = η·(1 + cos(πt/T))/2``: late rounds
    take smaller steps, which lowers the noise floor of the privatized iterates.
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.0, decay_steps: int | None = None) -> None:
        self.lr, self.momentum, self.decay_steps = lr, momentum, decay_steps
        self.buffer: torch.Tensor | None = None
        self.t = 0

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.momentum:
            self.buffer = update.clone() if self.buffer is None else self.momentum * self.buffer + update
            update = self.buffer
        lr = self.lr * cosine_factor(self.t, self.decay_steps)
        self.t += 1
        return params + lr * update

    def state_dict(self) -> dict:
        return {"buffer": self.buffer, "t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.buffer, self.t = state["buffer"], state["t"]


class ServerFTRL(ServerOptimizerBase):
    """FTRL on the privatized stream (DP-FTRL; with momentum DP-FTRLM, Kairouz et al. 2021).

    ``S_t = Σ_{τ≤t} Δ̄_τ`` (the running sum of privatized average deltas: with tree noise its
    noise is the tree's prefix noise), ``m_t = β m_{t−1} + S_t``, ``θ_t = θ_0 + η m_t``
    (β = 0: ``θ_t = θ_0 + η S_t``). Post-processing of the released stream. After :meth:`reset`
    at round T' (a public stage's model) the sums restart: ``S_t = Σ_{T'<τ≤t} Δ̄_τ``, whose tree
    noise is ``P_t − P_{T'}`` (two prefix estimates, so somewhat noisier; no privacy cost).
    """

    def __init__(self, lr: float = 1.0, momentum: float = 0.0) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"ftrl momentum must be in [0, 1), got {momentum}")
        self.lr, self.momentum = lr, momentum
        self.origin: torch.Tensor | None = None
        self.total: torch.Tensor | None = None
        self.buffer: torch.Tensor | None = None

    def step(self, params: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.origin is None:
            self.origin = params.clone()
        if self.total is None:
            self.total, self.buffer = torch.zeros_like(update), torch.zeros_like(update)
        self.total = self.total + update
        self.buffer = self.momentum * self.buffer + self.total
        return self.origin + self.lr * self.buffer

    def reset(self, params: torch.Tensor) -> None:
        """Re-anchor at ``params`` (a public stage's model): θ_0 ← params and the running sums
        restart, so θ_t = params + η m_t over the releases after the reset. Without it FTRL's
        ``θ_0 + η m_t`` would silently discard the new model (post-processing either way)."""
        self.origin = params.clone()
        if self.total is not None:
            self.total, self.buffer = torch.zeros_like(self.total), torch.zeros_like(self.buffer)

    def state_dict(self) -> dict:
        return {"origin": self.origin, "total": self.total, "buffer": self.buffer}

    def load_state_dict(self, state: dict) -> None:
        self.origin, self.total, self.buffer = state["origin"], state["total"], state["buffer"]


ServerOptimizer = ServerOptimizerBase


def build_server_optimizer(name: str, rounds: int | None = None, **kwargs) -> ServerOptimizer:
    """The server optimizer of option ``name`` (``optimizer=NAME``) with its keys ``kwargs``
    checked by its config dataclass; ``schedule: cosine`` (SGD variants) decays the rate over ``rounds``."""
    return load("optimizer", {"name": name, **kwargs}).build(rounds)


# --- config options (fedpriv/schema/parser.py registers them with Hydra) -------------------------


@dataclass
class SGDOptimizer(OptimizerOption):
    """``θ ← θ + η_t Δ̄`` (fedpriv/optim/server.py)."""

    name: str = "sgd"
    lr: float = 1.0  # server step size η on the privatized average update
    schedule: Literal["constant", "cosine"] = "constant"  # cosine: decay to 0 over the run's rounds

    def check(self, path: str) -> None:
        positive(self, "lr", path=path)

    def build(self, rounds: int | None = None):
        return ServerSGD(lr=self.lr, momentum=getattr(self, "momentum", 0.0),
                         decay_steps=rounds if self.schedule == "cosine" else None)


@dataclass
class MomentumOptimizer(SGDOptimizer):
    name: str = "momentum"
    momentum: float = 0.9  # heavy-ball coefficient (0: plain SGD)
    schedule: Literal["constant", "cosine"] = "cosine"

    def check(self, path: str) -> None:
        super().check(path)
        in_unit_interval(self, "momentum", path, closed_right=False, open_left=False)


@dataclass
class FTRLOptimizer(OptimizerOption):
    """DP-FTRL(M): θ_t = θ_0 + lr · m_t over the running sum of privatized updates."""

    name: str = "ftrl"
    lr: float = 0.1  # step size on the running sum of privatized updates
    momentum: float = 0.9  # momentum of the FTRL(M) update (0: none)

    def check(self, path: str) -> None:
        positive(self, "lr", path=path)
        in_unit_interval(self, "momentum", path, closed_right=False, open_left=False)

    def build(self, rounds: int | None = None):
        return ServerFTRL(lr=self.lr, momentum=self.momentum)


register_option("optimizer", "sgd", SGDOptimizer())
register_option("optimizer", "momentum", MomentumOptimizer())
register_option("optimizer", "ftrl", FTRLOptimizer())

