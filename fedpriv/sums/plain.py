"""``aggregation=plain``: each node's users' clipped updates reach the server in the clear; the
server adds the mechanism's noise to their sum. Under a mechanism whose parties add the noise
(``client_noise``: ``mechanism=ddgauss``) the parties' secure sum is simulated in this process
(``backend=local`` only: :mod:`fedpriv.sums.secure_sum`), so the server sees only their sum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedpriv.errors import ConfigError
from fedpriv.schema import SumOption, register_option
from fedpriv.sums.base import PARTIES, SERVER, SumPlan, who_adds_noise


@dataclass
class PlainSum(SumOption):
    """``aggregation=plain`` (the default; module docstring)."""

    sees: ClassVar[str] = "each user's clipped update (party noise in process: only the parties' simulated sum)"
    noise_by: ClassVar[tuple[str, ...]] = (SERVER, PARTIES)
    name: str = "plain"

    def check_run(self, spec) -> None:
        """Party noise needs its secure sum: in process only, with at least ``min_shares`` parties."""
        mechanism = spec.mechanism
        if not mechanism.client_noise:
            return
        if spec.backend.name != "local":
            raise ConfigError(f"mechanism={mechanism.name} over backend={spec.backend.name} needs aggregation=secagg: "
                              "its parties' messages must reach the server only as their sum")
        if mechanism.min_shares is not None and mechanism.min_shares > mechanism.parties:
            raise ConfigError(f"mechanism.min_shares={mechanism.min_shares} exceeds the {mechanism.parties} parties "
                              "(mechanism.shares)")

    def plan(self, spec, mechanism, dimension: int, expected_cohort: float) -> SumPlan:
        by = who_adds_noise(mechanism)
        return SumPlan(protocol=self.name, noise_by=by, sees=self.sees,
                       parties=int(mechanism.shares) if by == PARTIES else None)


register_option("aggregation", "plain", PlainSum())
