"""Noise mechanisms for the stream of aggregated updates (the shared part: :mod:`.base`).

Every mechanism generates round t's noise online (``noise(t, shape)``, drawn in round order),
checkpoints its state (``state_dict``/``load_state_dict``), states its own ``dp_accounting`` event
for a sampler (``dp_event``, ``neighboring_relation``; an unaccountable sampler is a
``ConfigError``) and can write its noise as an explicit matrix for small n (``matrix``). A run
builds its mechanism from its typed ``mechanism`` option (:meth:`fedpriv.schema.MechanismOption.build`).
"""

from __future__ import annotations

from fedpriv.mechanisms.bandmf import BandMFMechanism
from fedpriv.mechanisms.base import NoiseMechanism
from fedpriv.mechanisms.blt import BLTMechanism
from fedpriv.mechanisms.ddgauss import DistributedDiscreteGaussianMechanism
from fedpriv.mechanisms.gaussian import GaussianMechanism
from fedpriv.mechanisms.tree import TreeMechanism

Mechanism = NoiseMechanism

__all__ = ["BandMFMechanism", "BLTMechanism", "DistributedDiscreteGaussianMechanism",
           "GaussianMechanism", "Mechanism", "NoiseMechanism", "TreeMechanism"]
