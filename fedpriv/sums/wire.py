"""What the server and every node share on the secure path (``aggregation=secagg``), as
:mod:`fedpriv.round.codec` is for the clear path: Flower's int32 limit, the weight every node sends,
the field Flower's quantizer runs in, the run's fixed quantization and the keys of the round's
instructions. The server half is server/secagg.py, the node half client/secagg.py; both read
these from here and nowhere else.

Flower's SecAgg+ maps a coordinate in ``[−c, c]`` to ``[0, Q]`` (``Q`` levels, stochastic
rounding) and sums the results modulo ``M`` under pairwise masks; the server gets the *mean*
over the surviving nodes, each weighted by its ``num_examples`` over ``max_weight``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Flower's quantizer casts to int32: a node's levels Q = 2^bits − 1 (central noise) or a party's
# message in Z_m, m = 2^bits (distributed noise), must stay below 2^31, so at most 30 bits.
FLOWER_MAX_BITS = 30

# Every node's weight in Flower's SecAgg+ (the setup's ``max_weight`` and each reply's ``num_examples``):
# Flower's weighted mean is then the plain mean. Flower multiplies a node's vector by its weight over
# ``max_weight``, so a weight the server chose could scale a party's message (its noise share) away: the
# server and every node read it from here, and a node refuses a setup with another ``max_weight``.
SECAGG_WEIGHT = 1

# the keys of a round's instructions (the fit config the server sends each node with its users)
ROUND = "round"  # the round, 0-based
USERS = "users"  # the node's users, a comma list of decimal ids (SecAgg+'s config holds no list)
CLIP = "clip"  # the bound each of the node's users is clipped to
PARTY = "party"  # the node's index among the run's parties (its noise share's and its rounding's index)
ROUND_KEY = "ddgauss_round_key"  # distributed noise: the round's public rotation key
CODEC = "ddgauss_codec"  # distributed noise: the server's codec digest (the node checks it against its own)


def users_text(users: Iterable[int]) -> str:
    """A node's users as the instructions carry them (``USERS``)."""
    return ",".join(str(int(u)) for u in users)


def users_of(text: object) -> list[str]:
    """The ids of ``USERS`` as sent (strings; the node checks each: ``client.app.requested_users``)."""
    return [u for u in str(text).split(",") if u]


Field = tuple[int, float, int]  # (Q levels, the clipping range c, the modulus M) Flower's quantizer runs with


@dataclass(frozen=True)
class SecAggQuantization:
    """How ``aggregation=secagg`` (central noise) quantizes a node's sum in Flower's SecAgg+,
    fixed for the whole run from public quantities only — never from a round's cohort, so one
    user joining changes neither the grid nor the clip of anybody else.

    ``coordinate_range`` c: Flower clips each coordinate of a node's sum to ±c (1-Lipschitz: a
    busier node than planned loses accuracy, not privacy); ``levels`` Q = 2^bits − 1 steps of 2c/Q
    with stochastic rounding; ``modulus`` M; ``node_clip`` C′ = C − √d·2c/Q, each user's bound on
    its node, so that one user moves the rounded sum by at most C (coupled rounding moves each
    coordinate by less than one step)."""

    coordinate_range: float
    levels: int
    modulus: int
    node_clip: float

    @property
    def step(self) -> float:
        return 2.0 * self.coordinate_range / self.levels

    @property
    def field(self) -> Field:
        return self.levels, self.coordinate_range, self.modulus


def field_of(codec) -> Field:
    """Distributed DP through Flower's SecAgg+: ``(Q, c, M)`` under which Flower's quantizer is the
    identity on a party's message ``r`` ∈ Z_m (``codec``: a :class:`fedpriv.mechanisms.ddgauss_codec.DDGaussCodec`)
    sent as ``r − c`` (``Q = m − 1``, ``c = Q/2``: ``(x + c)·Q/2c = r`` exactly, an integer that
    stochastic rounding keeps), summed mod ``M = m``."""
    m = codec.modulus
    return m - 1, (m - 1) / 2.0, m
