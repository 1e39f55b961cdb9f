"""Tree-aggregation noise (DP-FTRL): online binary-tree noise for prefix sums of the round sums.

Rounds t = 1..n are the leaves of a binary tree; every completed dyadic interval (node) of
rounds gets one fresh Gaussian ``z ~ N(0, σ²C² I)``. The noisy prefix sum after round t adds the
noise of the ≤ ⌊log2 t⌋+1 nodes whose intervals tile [1, t] (the binary digits of t), so the
prefix noise has variance popcount(t)·σ²C² instead of t·σ²C² for independent noise, while one
user's contribution to a single round touches ⌊log2 n⌋+1 nodes (the privacy cost; accounted in
:mod:`fedpriv.accounting.tree`).

Estimators: ``plain`` uses each node's own noisy value; ``efficient`` (Honaker) replaces a node's
value, when it completes, by the inverse-variance weighted mean of its own value and the sum of
its two children's estimates (bottom-up, online): a node at height h has noise variance
``v_h = 1/(1/σ² + 1/(2 v_{h-1}))``, v_0 = σ² (in units of C²). Release is post-processing of the
same node values, so privacy is unchanged.

Online state: the stack of the current tiling's node estimates (≤ log2 n + 1 vectors) and the
previous prefix noise — O(log n · d) memory. ``noise(t)`` returns the *residual* per-round noise
``P_t − P_{t−1}``: added to round t's sum it makes the running sum of privatized round sums carry
exactly the prefix noise P_t, which is what FTRL integrates (``optimizer=ftrl``); any other server
optimizer may consume the same residual stream. ``restart_every=k`` starts a new tree every k
rounds (P restarts at 0; noise already released stays in the model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import dp_accounting
import torch

from fedpriv.accounting.tree import tree_accounting
from fedpriv.errors import ConfigError
from fedpriv.mechanisms.base import ZERO_OUT, trivial_event
from fedpriv.mechanisms.streaming import CorrelatedMechanism, StreamingOperator
from fedpriv.keys.randomness import NoiseStream
from fedpriv.sampling import CYCLIC, Sampler, SeparatedPattern
from fedpriv.schema import MechanismOption, positive, register_option

ESTIMATORS = ("plain", "efficient")


def node_variances(height: int, estimator: str) -> list[float]:
    """Noise variance (units σ²C²) of a node estimate at heights 0..height."""
    out = [1.0]
    for _ in range(height):
        out.append(1.0 if estimator == "plain" else 1.0 / (1.0 + 1.0 / (2.0 * out[-1])))
    return out


class TreeState:
    """One tree's online state: stack of (height, node estimate) for the current tiling."""

    def __init__(self) -> None:
        self.stack: list[tuple[int, torch.Tensor]] = []
        self.leaves = 0

    def add_leaf(self, draw: Callable[[], torch.Tensor], estimator: str) -> torch.Tensor:
        """Complete leaf ``leaves+1`` (and every node it completes); return the new prefix noise."""
        self.leaves += 1
        self.stack.append((0, draw()))
        while len(self.stack) >= 2 and self.stack[-1][0] == self.stack[-2][0]:
            (height, right), (_, left) = self.stack.pop(), self.stack.pop()
            own = draw()
            if estimator == "efficient":
                children_var = 2.0 * node_variances(height, estimator)[height]
                w = (1.0 / 1.0) / (1.0 + 1.0 / children_var)  # weight of the node's own value
                own = w * own + (1.0 - w) * (left + right)
            self.stack.append((height + 1, own))
        total = self.stack[0][1].clone()
        for _, value in self.stack[1:]:
            total += value
        return total


class TreeOperator(StreamingOperator):
    """Residual tree noise ``P_t − P_{t−1}`` (one draw per completed node), restarting every
    ``restart_every`` rounds; state: the tiling's node estimates and the previous prefix (rebuilt
    on resume by replaying the rounds since the last restart, never checkpointed)."""

    def __init__(self, estimator: str = "plain", restart_every: int | None = None) -> None:
        self.estimator, self.restart_every = estimator, restart_every
        self._tree = TreeState()
        self._previous: torch.Tensor | None = None

    def next(self, draw: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.restart_every and self._tree.leaves == self.restart_every:
            self._tree, self._previous = TreeState(), None
        prefix = self._tree.add_leaf(draw, self.estimator)
        residual = prefix if self._previous is None else prefix - self._previous
        self._previous = prefix
        return residual

    def starts_afresh(self, round_idx: int) -> bool:
        return round_idx == 0 or bool(self.restart_every) and round_idx % self.restart_every == 0

    def fresh(self) -> "TreeOperator":
        return TreeOperator(self.estimator, self.restart_every)

    def state_dict(self) -> dict:
        return {"estimator": self.estimator, "restart_every": self.restart_every}

    def load_state_dict(self, state: dict) -> None:
        for key in ("estimator", "restart_every"):
            if state[key] != getattr(self, key):
                raise ValueError(f"checkpoint's tree {key} {state[key]!r} differs from {getattr(self, key)!r}")


class TreeMechanism(CorrelatedMechanism):
    """Tree-aggregation noise with σ = ``noise_multiplier`` per node (std σ·C per coordinate)."""

    name = "tree"
    independent_noise = False  # z_t correlated across rounds

    def __init__(self, noise_multiplier: float, clip_norm: float, noise: NoiseStream | None = None,
                 estimator: str = "plain", restart_every: int | None = None, rounds: int | None = None) -> None:
        if estimator not in ESTIMATORS:
            raise ConfigError(f"unknown tree estimator {estimator!r} (choose one of: {', '.join(ESTIMATORS)})")
        if restart_every is not None and (not isinstance(restart_every, int) or restart_every < 1):
            raise ConfigError(f"mechanism.restart_every must be a positive integer or null, got {restart_every!r}")
        super().__init__(noise_multiplier, clip_norm, TreeOperator(estimator, restart_every), noise)
        self.rounds = rounds  # the planned run: prefixes are accounted without re-running its worst case

    @property
    def estimator(self) -> str:
        return self.operator.estimator

    @property
    def restart_every(self) -> int | None:
        """The noise and the accounting read the same value: the operator's."""
        return self.operator.restart_every

    # ---------------------------------------------------------------- accounting

    def neighboring_relation(self, sampler: Sampler) -> dp_accounting.NeighboringRelation:
        self._check_sampler(sampler)
        return ZERO_OUT

    def _check_sampler(self, sampler: Sampler) -> None:
        if not isinstance(sampler, SeparatedPattern):
            raise ConfigError(
                f"the tree mechanism is accounted for users taking part at most once per epoch in a "
                f"fixed order (sampling=cyclic), not sampling={sampler.kind}: tree noise gets no "
                "amplification from random sampling")

    def dp_event(self, sampler: Sampler, rounds: int, noise_multiplier: float | None = None
                 ) -> dp_accounting.DpEvent:
        """Single epoch (every user at most once): ``SingleEpochTreeAggregationDpEvent`` per tree.
        Several participations: a Gaussian with multiplier σ/√(Σ sens²), the worst case over
        placements at the sampler's separation (see :mod:`fedpriv.accounting.tree`); a prefix of
        the planned run is bounded from the planned run's worst case, computed once."""
        self._check_sampler(sampler)
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        if (trivial := trivial_event(sigma, rounds)) is not None:
            return trivial
        return self._accounting(sampler, rounds, sigma)[0]

    def accounting_details(self, sampler: Sampler, rounds: int) -> dict:
        """How each tree's sensitivity was obtained (exact, or a stated upper bound)."""
        self._check_sampler(sampler)
        if rounds == 0:
            return {}
        details = self._accounting(sampler, rounds, max(self.noise_multiplier, 1.0))[1]
        return {"tree_sensitivity": details} if details else {"tree_sensitivity": "single participation per tree"}

    def _accounting(self, sampler: Sampler, rounds: int, sigma: float):
        planned = self.rounds if self.rounds and self.rounds > rounds else None
        return tree_accounting(sigma, rounds, sampler.max_participations(rounds), sampler.min_separation,
                               self.restart_every, planned, sampler.max_participations(planned) if planned else None)


__all__ = ["ESTIMATORS", "TreeMechanism", "TreeOperator", "TreeState", "node_variances"]


# --- config option (fedpriv/schema/parser.py registers it with Hydra) --------------------------


@dataclass
class TreeNoise(MechanismOption):
    """DP-FTRL tree aggregation (needs sampling=cyclic)."""

    default_sampling: ClassVar[str] = CYCLIC  # what sampling=auto picks for this mechanism
    name: str = "tree"
    estimator: Literal["plain", "efficient"] = "efficient"  # efficient: Honaker's inverse-variance node estimates
    restart_every: Optional[int] = None  # start a new tree every k rounds (null: one tree)

    def check(self, path: str) -> None:
        positive(self, "restart_every", path=path)

    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        return TreeMechanism(noise_multiplier, clip_norm, noise=noise, estimator=self.estimator,
                             restart_every=self.restart_every, rounds=int(rounds) if rounds else None)


register_option("mechanism", "tree", TreeNoise())

