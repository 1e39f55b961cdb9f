"""Server optimizers. They consume the privatized average delta Δ̄_t (post-processing, so any
optimizer keeps the DP guarantee) and treat ``g_t = −Δ̄_t`` as the pseudo-gradient.
"""

from __future__ import annotations

import math

import torch

from fedpriv.errors import ConfigError
from fedpriv.optim.adaptive import ADAPTIVE_NAMES, DPAdaptive
from fedpriv.optim.base import ServerOptimizerBase


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
    (β = 0: ``θ_t = θ_0 + η S_t``). Post-processing of the released stream.
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


ServerOptimizer = ServerSGD | DPAdaptive | ServerFTRL


def build_server_optimizer(name: str, rounds: int | None = None, **kwargs) -> ServerOptimizer:
    """``sgd`` / ``momentum`` (SGD with momentum, default 0.9) / ``ftrl`` / ``adam`` (= ``dpadam_post``)
    / the DP adaptive variants of :mod:`fedpriv.optim.adaptive` (``dpadam_ime``, ``dpadagrad_bc``, …).

    ``schedule: cosine`` (SGD variants) decays the rate to 0 over ``rounds``; ``constant`` keeps it.
    """
    schedule = kwargs.get("schedule", "constant")
    if schedule not in ("constant", "cosine"):
        raise ConfigError(f"unknown optimizer.schedule {schedule!r} (choose one of: constant, cosine)")
    decay = rounds if schedule == "cosine" else None
    if name == "sgd":
        return ServerSGD(lr=kwargs.get("lr", 1.0), momentum=kwargs.get("momentum", 0.0), decay_steps=decay)
    if name == "momentum":
        return ServerSGD(lr=kwargs.get("lr", 1.0), momentum=kwargs.get("momentum", 0.9), decay_steps=decay)
    if name == "adam" or name in ADAPTIVE_NAMES:
        rule, variant = ADAPTIVE_NAMES.get(name, ("adam", "post"))
        return DPAdaptive(rule, variant, **{k: v for k, v in kwargs.items()
                                            if k in ("lr", "beta1", "beta2", "eps", "floor", "ime_fraction",
                                                     "stp_normalize", "stp_eps")})
    if name == "ftrl":
        return ServerFTRL(lr=kwargs.get("lr", 1.0), momentum=kwargs.get("momentum", 0.0))
    known = ", ".join(sorted(["adam", "ftrl", "momentum", "sgd", *ADAPTIVE_NAMES]))
    raise ConfigError(f"unknown server optimizer {name!r} (choose one of: {known})")
