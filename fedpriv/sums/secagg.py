"""``aggregation=secagg``: each round's node sums reach the server only as their sum, through
Flower's own SecAgg+ (``SecAggPlusWorkflow`` in server/secagg.py, ``secaggplus_mod`` in
client/secagg.py; what both share: :mod:`fedpriv.sums.wire`). With central noise the server adds
the mechanism's noise to the unmasked sum; with party noise (``mechanism=ddgauss``) every node is
a party and adds its share (docs/PRIVACY.md, "Secure aggregation").

The keys were the top-level section ``secagg`` before the ``aggregation`` group existed; ``secagg.*``
is still read for a release (:data:`fedpriv.schema.parser.RENAMED`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from fedpriv.errors import ConfigError
from fedpriv.mechanisms.ddgauss import users_bound
from fedpriv.schema import SumOption, positive, register_option
from fedpriv.schema.checks import _fail, _key
from fedpriv.sums.base import PARTIES, SERVER, SumPlan, who_adds_noise
from fedpriv.sums.wire import FLOWER_MAX_BITS, SecAggQuantization, field_of


@dataclass
class SecAggSum(SumOption):
    """``aggregation=secagg``: Flower's SecAgg+ (module docstring).

    Each node's clipped sum is clipped per coordinate to ``±clipping_range``, quantized to
    ``2^bits − 1`` levels and summed modulo ``2^modulus_bits`` under pairwise masks; the server
    learns only the sum of the surviving nodes' vectors."""

    sees: ClassVar[str] = "only the sum of the nodes' messages (SecAgg+ unmasks nothing else)"
    noise_by: ClassVar[tuple[str, ...]] = (SERVER, PARTIES)
    name: str = "secagg"
    shares: Optional[int] = None  # neighbours each node secret-shares its keys with (odd, > 2); null: all nodes
    threshold: Optional[int] = None  # shares needed to unmask a node (> shares / 2); null: 2/3 of the shares + 1
    bits: int = 20  # quantization levels 2^bits - 1 per coordinate of a node's sum
    modulus_bits: int = 32  # the field of the masked sum, 2^modulus_bits (Flower's masks are drawn in it)
    # per-coordinate clip of a node's sum, fixed for the run; null: privacy.clip_norm x (m/n + 4 sqrt(m/n)) for
    # an expected cohort m over n nodes (a busier node is clipped per coordinate: accuracy, never privacy)
    clipping_range: Optional[float] = None
    timeout: Optional[float] = None  # seconds each of the protocol's four stages waits (null: no limit)

    def check(self, path: str) -> None:
        positive(self, "bits", "modulus_bits", "clipping_range", "timeout", path=path)
        if self.bits > FLOWER_MAX_BITS:
            _fail(_key(path, "bits"), f"< {FLOWER_MAX_BITS + 1} (Flower quantizes into int32)", self.bits)
        if self.modulus_bits > 62:
            _fail(_key(path, "modulus_bits"), "<= 62", self.modulus_bits)
        if self.shares is not None and self.shares <= 2:
            _fail(_key(path, "shares"), "> 2 or null (all nodes)", self.shares)
        if self.threshold is not None and self.threshold < 2:
            _fail(_key(path, "threshold"), ">= 2 or null", self.threshold)

    def check_run(self, spec) -> None:
        """SecAgg+ between at least two Flower nodes; party noise with every node a party, in a field
        Flower's int32 quantizer holds; nothing that needs one user's clipped update at the server
        (the field's capacity and the grid are checked with the data's sizes, at plan time)."""
        mechanism = spec.mechanism
        if spec.backend.name == "local":
            if mechanism.client_noise:
                raise ConfigError(f"mechanism={mechanism.name} with backend=local simulates its parties' secure sum in "
                                  "process: leave aggregation=plain (aggregation=secagg runs Flower's SecAgg+ between "
                                  "nodes)")
            raise ConfigError("aggregation=secagg runs Flower's SecAgg+ between nodes: use backend=flower or a "
                              "deployment (backend=local simulates a secure sum only for mechanism=ddgauss)")
        nodes = int(getattr(spec.backend, "num_supernodes", 0))
        if mechanism.client_noise:
            if mechanism.shares is not None and mechanism.shares != nodes:
                raise ConfigError(f"mechanism={mechanism.name} over SecAgg+: every node is a party, so "
                                  f"mechanism.shares must be backend.num_supernodes={nodes} (leave it unset), got "
                                  f"{mechanism.shares}")
            if mechanism.min_shares is not None and mechanism.min_shares > nodes:
                raise ConfigError(f"mechanism.min_shares={mechanism.min_shares} exceeds the {nodes} parties "
                                  "(mechanism.shares)")
            if mechanism.bits > FLOWER_MAX_BITS:
                raise ConfigError(f"mechanism.bits={mechanism.bits}: Flower's SecAgg+ quantizes into int32, so its "
                                  f"field holds at most {FLOWER_MAX_BITS} bits")
        if nodes < 2:
            raise ConfigError(f"aggregation=secagg needs at least 2 nodes, got backend.num_supernodes={nodes}")
        if spec.privacy.clipping == "adaptive":
            raise ConfigError("aggregation=secagg: adaptive clipping needs each user's clipped flag at the server; "
                              "use privacy.clipping=fixed")

    def resolved_mechanism(self, spec):
        """Over SecAgg+ every node is a party: a distributed mechanism's ``shares=null`` is
        ``backend.num_supernodes`` (config.yaml names them)."""
        mechanism = spec.mechanism
        if mechanism.client_noise and mechanism.shares is None:
            return dataclasses.replace(mechanism, shares=int(spec.backend.num_supernodes))
        return mechanism

    def plan(self, spec, mechanism, dimension: int, expected_cohort: float) -> SumPlan:
        """SecAgg+'s sizes for the run's nodes (:func:`protocol_sizes`) and its field: the run's fixed
        quantization under central noise (:func:`secagg_quantization`), else the parties' field
        (:func:`fedpriv.sums.wire.field_of` of the mechanism's codec)."""
        nodes = int(spec.backend.num_supernodes)
        by = who_adds_noise(mechanism)
        shares, threshold = protocol_sizes(self, nodes, mechanism.min_shares if by == PARTIES else None)
        quantization = node_clip = None
        if by == PARTIES:
            field = field_of(mechanism.codec())
        else:
            quantization = secagg_quantization(self, spec.privacy.clip_norm, dimension, expected_cohort, nodes)
            field, node_clip = quantization.field, quantization.node_clip
        return SumPlan(protocol=self.name, noise_by=by, sees=self.sees, parties=nodes, shares=shares,
                       threshold=threshold, quantization=quantization, field=field, node_clip=node_clip,
                       timeout=self.timeout)


def secagg_quantization(settings: SecAggSum, clip_norm: float, dim: int, expected_cohort: float,
                        nodes: int) -> SecAggQuantization:
    """The run's :class:`~fedpriv.sums.wire.SecAggQuantization` for ``settings``: c =
    ``aggregation.clipping_range``, or C times the users a node holds at most in all but rare rounds
    (:func:`~fedpriv.mechanisms.ddgauss.users_bound` of the expected cohort over the nodes).
    ``ValueError`` when the nodes' sum would overflow the field or the rounding would take more
    than half of C."""
    levels = (1 << int(settings.bits)) - 1
    modulus = 1 << int(settings.modulus_bits)
    if nodes * levels >= modulus:
        raise ValueError(f"{nodes} nodes x 2^{settings.bits} levels overflow the field 2^{settings.modulus_bits}: "
                         "lower aggregation.bits or raise aggregation.modulus_bits")
    if settings.clipping_range is not None:
        coordinate_range = float(settings.clipping_range)
    else:
        coordinate_range = float(clip_norm) * users_bound(expected_cohort / max(1, nodes))
    reduced = clip_norm - math.sqrt(dim) * 2.0 * coordinate_range / levels
    if not reduced > 0.5 * clip_norm:
        raise ValueError(f"aggregation.bits={settings.bits} is too coarse for {dim} coordinates in a range of "
                         f"±{coordinate_range:.3g}: the rounding alone would take {clip_norm - reduced:.3g} of the "
                         f"clip norm {clip_norm:g}; give more bits")
    return SecAggQuantization(coordinate_range, levels, modulus, reduced)


def protocol_sizes(settings: SecAggSum, nodes: int, min_shares: int | None = None) -> tuple[int, int]:
    """SecAgg+'s ``(shares, threshold)`` for ``nodes`` nodes and the option ``settings``: ``shares``
    (the neighbours a node secret-shares with) defaults to all nodes, made odd where fewer; the
    threshold to ⌊2·shares/3⌋ + 1 (more than half must collude), and — for a distributed-noise
    mechanism — at least its ``min_shares``, so that Flower unmasks no sum that holds fewer noise
    shares than the accounting assumes (the server never sees an under-noised sum). ``ValueError``
    for a threshold not above half the shares, above them, or equal to them when the shares are
    fewer than the nodes (Flower's own rule), and for distributed noise with fewer shares than
    nodes (every node must hold every other's key shares)."""
    shares = nodes if settings.shares is None else min(int(settings.shares), nodes)
    if shares < nodes and shares % 2 == 0:
        shares += 1
    threshold = shares * 2 // 3 + 1 if settings.threshold is None else int(settings.threshold)
    if min_shares is not None:
        if shares < nodes:
            raise ValueError(f"distributed noise over SecAgg+ shares keys with every node: leave aggregation.shares "
                             f"unset (got {settings.shares} of {nodes} nodes)")
        if settings.threshold is not None and threshold < min_shares:
            raise ValueError(f"aggregation.threshold={threshold} is below mechanism.min_shares={min_shares}: the "
                             "server would unmask sums with fewer noise shares than the accounting assumes")
        threshold = max(threshold, min_shares)
    if not shares / 2 < threshold <= shares or (shares < nodes and threshold == shares):
        raise ValueError(f"aggregation.threshold={threshold} must exceed half of the {shares} shares and not exceed "
                         "them (be fewer, when the shares are fewer than the nodes)")
    return shares, threshold


register_option("aggregation", "secagg", SecAggSum())
