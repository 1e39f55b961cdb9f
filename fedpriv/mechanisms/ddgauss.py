"""``mechanism=ddgauss``: the distributed discrete Gaussian — the parties add the noise, the server none.

Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation" (ICML 2021). Round t's users are Poisson-sampled (rate q) and assigned to
``shares`` parties, the secure-aggregation participants; each party rounds each of its users'
clipped updates to the integer grid of step γ after the round's randomized Hadamard rotation,
adds one share of discrete Gaussian noise (every party, whether or not it holds a user), and
hands its message mod ``2^bits`` to secure aggregation, which reveals only their sum
(:mod:`fedpriv.mechanisms.ddgauss_codec` encodes and decodes). The server adds nothing: :meth:`noise` is
zero, and the decoded sum already carries ``Σ`` of the shares.

Accounting (:mod:`fedpriv.accounting.ddgauss`): with at least ``min_shares`` shares summed, one
round is Proposition 14's RDP at the summed noise ``√n_min·σ`` (the noise multiplier here is that
over the clip: ``σ_share = noise_multiplier·C/√min_shares``), amplified by Zhu–Wang's Poisson
bound; a round with fewer surviving shares is withheld (nothing released; survival assumed
independent of the data). The number of shares is fixed by the parties, not by the sampling, so
add/remove and zero-out give the same pair. γ follows from σ and the bits
(:func:`~fedpriv.accounting.ddgauss.granularity_for_bits`: ``headroom`` standard deviations of a
coordinate of the sum of up to ``users`` updates fit in the field), so calibration searches over
the noise multiplier alone and ε(σ) is non-increasing (σ/γ grows with σ; tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import dp_accounting
import torch

from fedpriv.accounting.ddgauss import (BETA, MAX_BITS, DistributedDiscreteGaussian,
                                        DistributedDiscreteGaussianDpEvent, expected_wraps, granularity_for_bits,
                                        padded_dim)
from fedpriv.mechanisms.ddgauss_codec import DDGaussCodec
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import NoiseMechanism, amplified_relation, trivial_event
from fedpriv.sampling import POISSON, PoissonPattern, Sampler
from fedpriv.schema import MechanismOption, register_option
from fedpriv.schema.checks import _fail, positive


def users_bound(expected_cohort: float) -> int:
    """The users a round's sum is sized for: the expected cohort plus four of its Poisson standard
    deviations (a larger cohort risks a coordinate wrapping around the field: accuracy, not privacy)."""
    return max(1, math.ceil(expected_cohort + 4.0 * math.sqrt(expected_cohort)))


class DistributedDiscreteGaussianMechanism(NoiseMechanism):
    """The distributed discrete Gaussian of a run (module docstring). ``dimension``: the update's
    coordinates (padded here to the rotation's power of two); ``users``: the cohort the field is
    sized for (:func:`users_bound`)."""

    name = "ddgauss"
    ordered = False  # each round's shares stand alone
    client_noise = True

    def __init__(self, noise_multiplier: float, clip_norm: float, noise=None, *, dimension: int, bits: int,
                 shares: int, min_shares: int, headroom: float, users: int) -> None:
        super().__init__(noise_multiplier, clip_norm, noise)
        if noise_multiplier == 0.0:
            raise ConfigError("mechanism=ddgauss needs noise (the parties' shares): privacy.noise_multiplier=0 is not "
                              "a distributed mechanism; use mechanism=gaussian for a non-private run")
        self.length, self.dim = int(dimension), padded_dim(int(dimension))
        self.bits, self.shares, self.min_shares = int(bits), int(shares), int(min_shares)
        self.headroom, self.users = float(headroom), int(users)
        self.distribution()  # refuses bits that cannot hold the sum (ValueError -> ConfigError)

    def distribution(self, noise_multiplier: float | None = None) -> DistributedDiscreteGaussian:
        """One round's mechanism at ``noise_multiplier`` (default: this one's): the share std and
        the grid step γ its bits allow."""
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        share_std = z * self.clip_norm / math.sqrt(self.min_shares)
        try:
            gamma = granularity_for_bits(self.clip_norm, share_std, self.shares, self.dim, self.bits, self.headroom,
                                         users=self.users)
        except ValueError as err:
            raise ConfigError(f"mechanism.bits={self.bits}: {err}") from None
        return DistributedDiscreteGaussian(self.clip_norm, gamma, share_std, self.min_shares, self.dim)

    def codec(self) -> DDGaussCodec:
        """The parties' encoding and the server's decoding at this mechanism's σ."""
        return DDGaussCodec(self.distribution(), self.bits)

    def noise(self, round_idx: int, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        """Zero: the parties' shares are the noise, already in the decoded sum."""
        return torch.zeros(tuple(shape))

    def withheld(self, shares: int | None) -> bool:
        """Whether a round whose secure sum holds ``shares`` shares must release nothing (fewer than
        the ``min_shares`` the accounting assumes). ``None`` (clear updates) is an error: this
        mechanism's noise exists only in a secure sum."""
        if shares is None:
            raise RuntimeError("mechanism=ddgauss received clear updates: its noise is added by the parties, so only "
                               "a secure sum of their messages can be released")
        return shares < self.min_shares

    def _residual(self, draw):
        raise RuntimeError("the distributed discrete Gaussian draws no server noise")

    def matrix(self, rounds: int) -> torch.Tensor:
        """Independent noise per round: the identity (float64)."""
        return torch.eye(rounds, dtype=torch.float64)

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        if isinstance(sampler, PoissonPattern):
            return amplified_relation(sampler)
        raise ConfigError(f"mechanism=ddgauss is accounted for Poisson sampling only (Zhu–Wang amplification), not "
                          f"sampling={sampler.kind}")

    def dp_event(self, sampler: Sampler, rounds: int, noise_multiplier: float | None = None) -> dp_accounting.DpEvent:
        self.neighboring_relation(sampler)
        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if (trivial := trivial_event(z, rounds)) is not None:
            return trivial
        dist = self.distribution(z)
        return DistributedDiscreteGaussianDpEvent(z, self.min_shares, self.dim, dist.granularity / self.clip_norm,
                                                  sampler.rate, rounds, BETA, fixed_parties=True)

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict[str, Any]:
        """What privacy.json records: the field, the grid, the shares and who adds the noise."""
        del sampler, rounds
        dist = self.distribution()
        return {"noise_added_by": "the parties (one discrete Gaussian share each); the server adds none",
                "bits": self.bits, "field_size": 1 << self.bits, "shares": self.shares,
                "min_shares": self.min_shares, "share_std": dist.local_std,
                "summed_noise_std_at_min_shares": math.sqrt(self.min_shares) * dist.local_std,
                "granularity": dist.granularity, "padded_dim": self.dim, "rounding_beta": dist.beta,
                "l2_sensitivity_on_the_grid": dist.l2_sensitivity, "field_sized_for_users": self.users,
                "headroom_std": self.headroom,
                "expected_wraps_per_round": expected_wraps(self.clip_norm, dist.granularity, dist.local_std,
                                                           self.shares, self.dim, self.bits, self.users),
                "bound": "Kairouz, Liu and Steinke 2021, Proposition 14; Zhu and Wang 2019, Theorem 5",
                "withheld_below_min_shares": True}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "bits": self.bits, "shares": self.shares, "min_shares": self.min_shares}

    def load_state_dict(self, state: dict) -> None:
        self._check_name(state)
        for key in ("bits", "shares", "min_shares"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"checkpoint's ddgauss {key}={state[key]} differs from this run's "
                                 f"{getattr(self, key)}")
        super().load_state_dict(state)


# --- config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class DDGaussNoise(MechanismOption):
    """``mechanism=ddgauss``: distributed discrete Gaussian noise (the parties add it; module docstring)."""

    default_sampling: ClassVar[str] = POISSON
    accounting_fields: ClassVar[tuple[str, ...]] = ("bits", "shares", "min_shares", "headroom")
    client_noise: ClassVar[bool] = True
    in_process_parties: ClassVar[int] = 8  # the parties of a backend=local run left at shares=null
    name: str = "ddgauss"
    bits: int = 20  # the field Z_m, m = 2^bits, of secure aggregation (at most 44)
    # parties (secure-aggregation participants), each adding one noise share every round; null: the sum
    # protocol's (aggregation=secagg: every node, backend.num_supernodes), 8 in process (backend=local)
    shares: int | None = None
    min_shares: int | None = None  # shares every released round is guaranteed (fewer: withheld); null: all of them
    headroom: float = 4.0  # standard deviations of a coordinate of the sum the field holds (sets the grid step)

    @property
    def parties(self) -> int:
        """The parties: ``shares``, or in process its default (a SecAgg+ run's config names them:
        :meth:`fedpriv.sums.secagg.SecAggSum.resolved_mechanism`)."""
        return self.in_process_parties if self.shares is None else int(self.shares)

    def check(self, path: str) -> None:
        positive(self, "shares", "headroom", path=path)
        if not 2 <= self.bits <= MAX_BITS:
            _fail(f"{path}.bits", f"in [2, {MAX_BITS}]", self.bits)
        if self.min_shares is not None and self.shares is not None and not 1 <= self.min_shares <= self.shares:
            _fail(f"{path}.min_shares", f"in [1, shares={self.shares}] or null", self.min_shares)
        if self.min_shares is not None and self.min_shares < 1:
            _fail(f"{path}.min_shares", "at least 1 or null", self.min_shares)

    def check_run(self, spec) -> None:
        """What else of the run it needs: clients' own updates, nothing that reads the clear sum or a
        single user's update at the server. Where its parties' sum travels, and how many parties
        there are, the sum protocol checks (fedpriv/sums/: ``aggregation``)."""
        if not spec.algorithm.local_training:
            raise ConfigError(f"mechanism=ddgauss needs clients that send their own updates (algorithm=dp_fedavg), "
                              f"not algorithm={spec.algorithm.name}")
        if spec.privacy.clipping == "adaptive":
            raise ConfigError("mechanism=ddgauss cannot count clipped updates in a secure sum: privacy.clipping=fixed")
        if spec.audit.canaries:
            raise ConfigError("mechanism=ddgauss: the audit's canaries join the clear sum; audit.canaries=0")
        if spec.privacy.accountant != "rdp":
            raise ConfigError(f"mechanism=ddgauss is accounted by RDP only (Proposition 14), not "
                              f"privacy.accountant={spec.privacy.accountant}")

    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        if dimension is None or sampler is None:
            raise ConfigError("mechanism=ddgauss is sized by the model's parameter count and the cohort: a calculator "
                              "without them cannot build it (python -m fedpriv.accounting ddgauss plans it)")
        return DistributedDiscreteGaussianMechanism(
            noise_multiplier, clip_norm, noise, dimension=dimension, bits=self.bits, shares=self.parties,
            min_shares=self.parties if self.min_shares is None else self.min_shares, headroom=self.headroom,
            users=users_bound(sampler.expected_cohort))


register_option("mechanism", "ddgauss", DDGaussNoise())
