"""Noise mechanisms for the stream of aggregated updates."""

from fedpriv.mechanisms.gaussian import GaussianMechanism

__all__ = ["GaussianMechanism"]
