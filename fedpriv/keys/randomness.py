"""The randomness a run's privacy guarantee relies on: one run key, two modes, named streams.

Every draw the DP guarantee relies on — the mechanisms' noise, the cohorts, the cyclic-Poisson
groups — is read from a keyed stream ``SHAKE-256(key ‖ label ‖ index)`` (the extendable-output
function of FIPS 202 used as a keystream: without the key its output is indistinguishable from
uniform bits). Two modes decide where the 32-byte run key comes from:

* **research** (``privacy.secure_rng=false``): ``key = SHA-256(tag ‖ canonical JSON of the run's
  config)`` (:mod:`fedpriv.keys.research_key`: the values that change what the run computes, where they
  differ from their defaults; inputs by content, not by path). A run is reproducible from its seed
  and config, and two runs whose configs differ in anything that changes the training (budget,
  noise, clip, learning rate, seed, ...) share no noise, no cohort and no mask — unless they ask
  for paired randomness (``privacy.research_key=seed``: the key is the seed's alone). Anyone
  holding ``config.yaml`` can regenerate all of it, so every output of such a run says "not for
  release".
* **secure** (``privacy.secure_rng=true``; the default for deployments): ``key`` is 32 bytes of the
  OS CSPRNG (:func:`secrets.token_bytes`). It is kept only in the checkpoint (written owner-only;
  see :mod:`fedpriv.release.rundir`), which is therefore secret: nothing else written or sent holds it.

Clients draw their own randomness per (round, user) (:class:`ClientDraws`): a 256-bit secret key
— derived from the research key in research mode, fresh OS entropy in secure mode (never stored,
never sent) — from which the example-level DP masks (SHAKE-256 uniforms) and noise (a ChaCha20
keystream, :class:`fedpriv.keys.keystream.GaussianKeystream`) are read, so the server cannot
replay them; and a ``torch.Generator`` for the minibatch order of plain local SGD, which no
guarantee relies on.

Floating point: the mechanisms' normals come from the Box–Muller transform in float32 of a 64-bit
radius word and a 32-bit angle word (:class:`NoiseStream`; ``|z| ≤ 9.49``); like every
floating-point Gaussian sampler this does not address the least-significant-bit attack of
Mironov, "On Significance of the Least Significant Bits for Differential Privacy" (docs/PRIVACY.md).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedpriv.keys.keystream import GaussianKeystream

RESEARCH = "research"
SECURE = "secure"
MODES = (RESEARCH, SECURE)
PAIRED = "paired"  # the label of research mode under privacy.research_key=seed
KEY_BYTES = 32

RESEARCH_NOTE = "randomness reproducible from the seed: not for release"
PAIRED_NOTE = "paired randomness: shared with every run of this seed; not for release"
SECURE_NOTE = "randomness from the OS CSPRNG; the checkpoint holds the run key and is secret"


def _encode(label: str, index: tuple[int, ...]) -> bytes:
    return json.dumps([label, *[int(i) for i in index]], separators=(",", ":")).encode()


def keystream(key: bytes, label: str, index: tuple[int, ...], nbytes: int) -> bytes:
    """``nbytes`` bytes of ``SHAKE-256(key ‖ label ‖ index)``: a prefix of the same stream for any
    ``nbytes`` (so the i-th value of a block does not depend on how many are read)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"a run key has {KEY_BYTES} bytes, got {len(key)}")
    return hashlib.shake_256(key + _encode(label, index)).digest(nbytes)


def uniforms(key: bytes, label: str, index: tuple[int, ...], n: int) -> np.ndarray:
    """``n`` uniforms in [0, 1) with 53 random bits each (float64)."""
    words = np.frombuffer(keystream(key, label, index, 8 * n), dtype="<u8")
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def uint64s(key: bytes, label: str, index: tuple[int, ...], n: int) -> np.ndarray:
    """``n`` uniform 64-bit words."""
    return np.frombuffer(keystream(key, label, index, 8 * n), dtype="<u8").copy()


def mode_label(described: Mapping[str, Any]) -> str:
    """The mode label of a :meth:`RunRandomness.describe` dict (privacy.json's ``randomness``)."""
    return PAIRED if described.get("paired") else described.get("mode", RESEARCH)


@dataclass(frozen=True)
class RunRandomness:
    """The run key and its mode (server side). ``key`` is secret in secure mode: never printed."""

    key: bytes = field(repr=False)
    mode: str = RESEARCH
    paired: bool = False  # research mode keyed by the seed alone (privacy.research_key=seed)

    @staticmethod
    def fresh() -> "RunRandomness":
        """Secure mode: a fresh key from the OS CSPRNG (a research key is derived by the caller:
        :func:`fedpriv.keys.research_key.run_randomness`)."""
        return RunRandomness(secrets.token_bytes(KEY_BYTES), SECURE)

    @property
    def secure(self) -> bool:
        return self.mode == SECURE

    @property
    def label(self) -> str:
        """What outputs call the mode: research, secure, or paired (research keyed by the seed)."""
        return PAIRED if self.paired else self.mode

    def subkey(self, label: str) -> bytes:
        """An independent key for one consumer (sampler, mechanism)."""
        return keystream(self.key, "subkey:" + label, (), KEY_BYTES)

    def noise(self, label: str = "mechanism") -> "NoiseStream":
        return NoiseStream(self.subkey(label))

    def state_dict(self) -> dict:
        return {"mode": self.mode, "paired": self.paired,
                "key": torch.frombuffer(bytearray(self.key), dtype=torch.uint8).clone()}

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> "RunRandomness":
        key = bytes(state["key"].tolist())
        if state.get("mode") not in MODES or len(key) != KEY_BYTES:
            raise ValueError("malformed run randomness state")
        return RunRandomness(key, state["mode"], paired=bool(state.get("paired", False)))

    def describe(self) -> dict:
        """For privacy.json / summary.json: the mode, never the key."""
        if self.secure:
            return {"mode": self.mode, "reproducible_from_seed": False, "note": SECURE_NOTE}
        return {"mode": self.mode, "reproducible_from_seed": True, **({"paired": True} if self.paired else {}),
                "note": PAIRED_NOTE if self.paired else RESEARCH_NOTE}


class NoiseStream:
    """Gaussian noise for a mechanism: draw ``k`` is the normals of a ChaCha20 keystream
    (:class:`~fedpriv.keys.keystream.GaussianKeystream`, 64-bit radius words: ``|z| ≤ 9.49``,
    on every core) under the draw's own key ``SHAKE-256(key ‖ "noise" ‖ k)`` (32 bytes).

    The state is the number of draws so far (checkpointed), so a resumed run continues the same
    stream; the key comes from :class:`RunRandomness` and is never part of the state.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a noise key has {KEY_BYTES} bytes, got {len(key)}")
        self._key = key
        self.draws = 0

    def normal(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        draw_key = keystream(self._key, "noise", (self.draws,), KEY_BYTES)
        self.draws += 1
        return GaussianKeystream(draw_key, wide_tail=True).normal(tuple(shape))

    def at(self, draws: int) -> "NoiseStream":
        """The same stream positioned at draw ``draws`` (a replay of earlier draws; this one is not moved)."""
        replica = NoiseStream(self._key)
        replica.draws = int(draws)
        return replica

    def state_dict(self) -> dict:
        return {"draws": self.draws}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.draws = int(state["draws"])


@dataclass(frozen=True)
class ClientDraws:
    """One client's randomness in one round.

    ``key`` (32 bytes, secret: never printed, stored or sent) keys every draw a guarantee relies
    on: the Poisson masks of example-level DP-SGD (:meth:`mask_uniforms`, SHAKE-256) and its noise
    (:attr:`noise_key`, a ChaCha20 keystream). ``order`` is a fast ``torch.Generator`` for the
    minibatch order of plain local SGD: nothing privacy-relevant follows from it (torch keeps 32
    bits of its seed, so it is never used for a secret draw).
    """

    order: torch.Generator
    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise ValueError(f"a client key has {KEY_BYTES} bytes, got {len(self.key)}")

    @property
    def noise_key(self) -> bytes:
        """The key of the client's example-level DP noise stream (independent of the masks')."""
        return keystream(self.key, "example-noise", (), KEY_BYTES)

    def mask_uniforms(self, step: int, n: int) -> np.ndarray:
        """``n`` uniforms (53 bits) of local DP-SGD step ``step``: row i joins iff its value < q."""
        return uniforms(self.key, "example-mask", (step,), n)


def _order_generator(seed_word: np.uint64) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed_word >> np.uint64(1)))  # the order only: not a secret


@dataclass(frozen=True)
class ClientRandomness:
    """Where clients' draws come from: the research key (reproducible), or OS entropy (secure)."""

    research: bytes | None = field(default=None, repr=False)  # the research key; None in secure mode

    def draws(self, round_idx: int, user: int) -> ClientDraws:
        """Client ``user``'s randomness in round ``round_idx``: in secure mode a fresh 256-bit key
        from the OS CSPRNG (and the order generator derived from it); in research mode both
        derived from the research key and ``(round, user)``."""
        if self.research is None:
            key = secrets.token_bytes(KEY_BYTES)
            return ClientDraws(_order_generator(uint64s(key, "order", (), 1)[0]), key)
        return ClientDraws(_order_generator(uint64s(self.research, "client", (round_idx, user), 1)[0]),
                           keystream(self.research, "client-secret", (round_idx, user), KEY_BYTES))

    def party_key(self, round_idx: int, party: int) -> bytes:
        """The secret key of secure-aggregation party ``party`` in round ``round_idx`` (its users'
        rounding and its noise share under distributed DP, :mod:`fedpriv.mechanisms.ddgauss_codec`): fresh
        OS entropy in secure mode; derived from the research key and ``(round, party)`` in
        research mode (a label no client draw uses)."""
        if self.research is None:
            return secrets.token_bytes(KEY_BYTES)
        return keystream(self.research, "party-secret", (round_idx, party), KEY_BYTES)
