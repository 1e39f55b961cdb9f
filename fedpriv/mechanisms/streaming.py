"""One streaming interface for correlated noise: a lower-triangular operator applied online.

Round t's residual noise is ``w_t = Σ_{j ≤ t} M[t, j] z_j`` — ``z_j`` the stream's unit draws
(times σC) in order, ``M`` lower triangular in the order of draws — computed one round at a
time from a bounded state (the style of jax_privacy's streaming matrices). Tree aggregation
("Practical and Private (Deep) Learning without Sampling or Shuffling", Kairouz et al. 2021)
and banded matrix factorization ("(Amplified) Banded Matrix Factorization", Choquette-Choo et al.
2023) are two such operators; a new one (BLT) is a subclass with its own ``next`` and state.

The checkpoint holds no noise. Every draw ``z_k`` is a function of the run key, its index k and
its shape (:class:`~fedpriv.keys.randomness.NoiseStream`), so an operator's state after round t —
BandMF's last b−1 residuals, BLT's buffers, the tree's node estimates — is a function of the key
and t: it is rebuilt on resume by replaying ``next`` from the last round where the state was
empty (round 0; the tree's last restart) over the same draws, in the same order and with the same
float operations, hence bit-identical on the same torch and CPU kernels. The checkpoint keeps that
round, its draw index, the draw shape, a SHA-256 of the last residual and the kernels (torch's
version, its CPU capability), and a resume checks them (fail closed: other kernels, or a key,
position or strategy that does not reproduce the noise, are refused, never used). A resume
costs one draw of the model's size (and the operator's O(window · d) arithmetic) per replayed round.
"""

from __future__ import annotations

import hashlib

from collections.abc import Callable

import torch

from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import NoiseMechanism, require_noise
from fedpriv.keys.randomness import NoiseStream

Draw = Callable[[], torch.Tensor]


class StreamingOperator:
    """``next(draw)`` consumes the round's fresh draws (``draw()`` returns the next ``z``; an
    operator may take several per round, the tree one per completed node) and returns ``w_t``.

    Its state is a function of the draws since the last round it :meth:`starts_afresh` at; its
    ``state_dict`` holds only its settings (never a tensor of the model's size): the mechanism
    rebuilds the rest by replay (module docstring)."""

    def next(self, draw: Draw) -> torch.Tensor:
        raise NotImplementedError

    def starts_afresh(self, round_idx: int) -> bool:
        """Whether the state before round ``round_idx`` (0-based) is the empty state (round 0)."""
        return round_idx == 0

    def fresh(self) -> "StreamingOperator":
        """The same operator with no round consumed yet (for :meth:`matrix`)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The operator's settings (checked on load); no noise."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Check the settings of :meth:`state_dict` (``ValueError`` for another operator's)."""

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
        self._shape: tuple[int, ...] | None = None  # every draw's shape (the model's, + the count's coordinate)
        self._anchor: tuple[int, int] | None = None  # (round, draw index) where the operator last started afresh
        self._last: torch.Tensor | None = None  # the last residual (its digest checks a replay)

    def noise(self, round_idx: int, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        shape = tuple(int(n) for n in shape)
        if self._shape is not None and shape != self._shape:
            raise ValueError(f"{self.name} noise of shape {shape} after draws of shape {self._shape}")
        self._shape = shape
        return super().noise(round_idx, shape)

    def _residual(self, draw: Draw) -> torch.Tensor:
        if self.operator.starts_afresh(self.rounds_done):
            self._anchor = (self.rounds_done, require_noise(self._noise, self.name).draws)
        w = self.operator.next(draw)
        self.rounds_done += 1
        self._last = w
        return w

    def matrix(self, rounds: int) -> torch.Tensor:
        return self.operator.matrix(rounds)

    def state_dict(self) -> dict:
        """The base state, the operator's settings, and where a replay starts (``replay``: the
        round and draw index of the anchor, the draw shape, the SHA-256 of the last residual;
        None before the first noisy round) — O(1) in the model's size."""
        replay = None
        if self._anchor is not None:
            replay = {"round": self._anchor[0], "draw": self._anchor[1], "shape": list(self._shape or ()),
                      "last_sha256": _digest(self._last), "kernels": kernels()}
        return {**super().state_dict(), **self.operator.state_dict(), "rounds_done": self.rounds_done,
                "replay": replay}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counters, then rebuild the operator's state by replaying its rounds since the
        anchor from the key's stream, and check the replay: it must end at the checkpoint's draw
        index with the checkpoint's last residual (``ValueError`` otherwise)."""
        super().load_state_dict(state)
        self.operator.load_state_dict(state)
        self.rounds_done = int(state["rounds_done"])
        replay = state["replay"]
        if replay is None:  # no noisy round yet (or σ = 0): the empty state
            self.operator, self._anchor, self._last = self.operator.fresh(), None, None
            if self.noise_multiplier != 0.0 and self.rounds_done:
                raise ValueError(f"checkpoint's {self.name} noise has {self.rounds_done} rounds but no replay point")
            return
        if replay["kernels"] != kernels():
            was, now = replay["kernels"], kernels()
            raise ConfigError(
                f"this checkpoint's {self.name} noise is rebuilt by replaying its rounds, bit for bit only with the "
                f"float kernels that ran them (torch {was['torch']}, CPU capability {was['cpu_capability']}); this "
                f"machine has torch {now['torch']}, CPU capability {now['cpu_capability']}: resume where it was "
                f"written, or with that torch and ATEN_CPU_CAPABILITY={str(was['cpu_capability']).lower()} if this "
                "CPU has it")
        self._replay(int(replay["round"]), int(replay["draw"]), tuple(int(n) for n in replay["shape"]),
                     str(replay["last_sha256"]))

    def _replay(self, start: int, first_draw: int, shape: tuple[int, ...], last_sha256: str) -> None:
        stream = require_noise(self._noise, self.name)
        if not 0 <= start < self.rounds_done or not 0 <= first_draw <= stream.draws:
            raise ValueError(f"checkpoint's {self.name} replay point (round {start}, draw {first_draw}) lies outside "
                             f"its {self.rounds_done} rounds and {stream.draws} draws")
        if not self.operator.starts_afresh(start):
            raise ValueError(f"checkpoint's {self.name} replay starts at round {start}, where its state is not empty")
        replica = stream.at(first_draw)
        operator = self.operator.fresh()
        w = None
        for _ in range(start, self.rounds_done):
            w = operator.next(lambda: replica.normal(shape) * self.std)
        if replica.draws != stream.draws or _digest(w) != last_sha256:
            raise ValueError(f"the {self.name} noise replayed from the key does not match the checkpoint's (another "
                             "key, strategy or stream position)")
        self.operator, self._shape, self._anchor, self._last = operator, shape, (start, first_draw), w


def kernels() -> dict[str, str]:
    """What a replay's float results depend on besides the key: torch's version and the CPU kernels
    it dispatches to (a fused multiply-add rounds differently from a multiply then an add)."""
    return {"torch": str(torch.__version__), "cpu_capability": str(torch.backends.cpu.get_cpu_capability())}


def _digest(tensor: torch.Tensor | None) -> str:
    """SHA-256 of a tensor's bytes (in the secret checkpoint only: it is a digest of noise)."""
    if tensor is None:
        return ""
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()
