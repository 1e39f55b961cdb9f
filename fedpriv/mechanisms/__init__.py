"""Noise mechanisms for the stream of aggregated updates (the shared part: :mod:`.base`).

Every mechanism generates round t's noise online (``noise(t, shape)``, drawn in round order),
checkpoints its state (``state_dict``/``load_state_dict``), states its own ``dp_accounting`` event
for a sampler (``dp_event``, ``neighboring_relation``; an unaccountable sampler is a
``ConfigError``) and can write its noise as an explicit matrix for small n (``matrix``).
"""

from __future__ import annotations

from typing import Any, Mapping

from fedpriv.mechanisms.bandmf import BandMFMechanism
from fedpriv.mechanisms.base import NoiseMechanism
from fedpriv.mechanisms.blt import BLTMechanism
from fedpriv.mechanisms.gaussian import GaussianMechanism
from fedpriv.mechanisms.tree import TreeMechanism
from fedpriv.randomness import NoiseStream
from fedpriv.schema import load

Mechanism = NoiseMechanism


def build_mechanism(cfg: Mapping[str, Any], noise_multiplier: float, clip_norm: float,
                    noise: NoiseStream | None = None, rounds: int | None = None, sampler=None) -> Mechanism:
    """The mechanism named by ``cfg['name']`` with its options from ``cfg`` (the Hydra group), its
    draws from ``noise`` (None: accounting only); ``rounds`` sizes BandMF's and BLT's strategies,
    ``sampler`` (its participation pattern) is what BLT optimises for."""
    return load("mechanism", dict(cfg)).build(noise_multiplier, clip_norm, noise=noise, rounds=rounds, sampler=sampler)


__all__ = ["BandMFMechanism", "BLTMechanism", "GaussianMechanism", "Mechanism", "NoiseMechanism", "TreeMechanism",
           "build_mechanism"]
