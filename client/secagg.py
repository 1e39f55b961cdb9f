"""The node half of ``aggregation=secagg`` (:mod:`fedpriv.sums.secagg`), beside the server half
(server/secagg.py) — Flower's own pairing of ``SecAggPlusWorkflow`` with ``secaggplus_mod``. What
both halves share (the field, the weight, Flower's int32 limit, the instructions' keys) is
:mod:`fedpriv.sums.wire`.

A node follows its own plan of the run's public config (:func:`node_plan`: the same
:func:`fedpriv.sums.plan_sum` the server's run plan calls), never the server's messages: it
refuses a setup or a round whose protocol, field or noise differs (:func:`checked_request`), then
answers the round once (client/app.py) with its masked message (:func:`masked_reply`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key
from flwr.compat.common import recorddict_compat as compat

from fedpriv.round.aggregation import RoundAggregate
from fedpriv.round.clients import iter_client_updates
from fedpriv.mechanisms.ddgauss_codec import DDGaussCodec
from fedpriv.plan import build_plan
from fedpriv.keys.randomness import ClientRandomness, uint64s
from fedpriv.schema import RunConfig, as_dict
from fedpriv.sums.secure_sum import party_message
from fedpriv.sums import SumPlan, party_codec, wire
from fedpriv.task import Task, load_task


def is_secagg_message(msg: Message) -> bool:
    """Whether ``msg`` is one of SecAgg+'s (it carries the protocol's stage)."""
    return RECORD_KEY_CONFIGS in msg.content.config_records


def secure_aggregation_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's ``secaggplus_mod`` for the messages of its protocol (they carry its stage); every
    other message passes through (``client.app.reply`` refuses a clear round where the run asked for
    secure aggregation)."""
    if is_secagg_message(msg):
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


@dataclass(frozen=True)
class NodePlan:
    """What a node of a secure run derives from the run's public config itself (its own run plan),
    never from the server's messages: the run's :class:`~fedpriv.sums.SumPlan` (SecAgg+'s field, its
    shares and threshold: the threshold at least ``min_shares`` under party noise; the bound C′ its
    users are clipped to under central noise) and, where the parties add the noise, the
    mechanism's codec at the calibrated σ (``mechanism=ddgauss``)."""

    sums: SumPlan
    codec: DDGaussCodec | None


_PLANS: dict[str, NodePlan] = {}


def node_plan(spec: RunConfig) -> NodePlan:
    """:class:`NodePlan` of ``spec``, planned once per config by the server's own planner
    (:func:`fedpriv.plan.build_plan`, which calls :func:`fedpriv.sums.plan_sum`: σ calibrated to the
    target ε, the run's fixed grid)."""
    text = json.dumps(as_dict(spec), sort_keys=True, default=str)
    if text not in _PLANS:
        if len(_PLANS) >= 4:  # a long-lived node: keep the last few runs' plans
            _PLANS.pop(next(iter(_PLANS)))
        plan = build_plan(spec, load_task(spec))
        _PLANS[text] = NodePlan(plan.sums, party_codec(plan.sums, plan.ledger.mechanism))  # the key-less mechanism
    return _PLANS[text]


def _check_protocol(own: SumPlan, values: Mapping[str, Any] | None) -> None:
    """SecAgg+'s settings as the server sent them at setup (``values``: what the mod keeps in its
    state) must be the node's own, checked before the node hands the mod the one message that carries
    its users (the masked vector; a node that refuses sends none, so no sum holds it under settings
    it did not plan): another quantization or field would change what the sum means (or its
    sensitivity); a threshold other than the plan's could unmask a sum with fewer noise shares than
    the accounting assumes (below ``min_shares``); more shares than planned, or a ``max_weight``
    other than :data:`~fedpriv.sums.wire.SECAGG_WEIGHT` (Flower scales a node's vector by its weight
    over it), would change whose messages the sum holds, and how much of each."""
    levels, coordinate_range, modulus = own.field
    shares, threshold = own.shares, own.threshold
    if (values is None or int(values[Key.TARGET_RANGE]) != levels or int(values[Key.MOD_RANGE]) != modulus
            or not math.isclose(float(values[Key.CLIPPING_RANGE]), coordinate_range, rel_tol=1e-12)):
        raise RuntimeError(f"the server's SecAgg+ settings differ from this node's plan (levels {levels}, range "
                           f"{coordinate_range:g}, field {modulus})")
    if int(values[Key.THRESHOLD]) != threshold or not threshold <= int(values[Key.SHARE_NUMBER]) <= shares:
        raise RuntimeError(f"the server's SecAgg+ threshold {values[Key.THRESHOLD]} of {values[Key.SHARE_NUMBER]} "
                           f"shares differs from this node's plan (threshold {threshold} of at most {shares} shares)")
    if float(values.get(Key.MAX_WEIGHT, math.nan)) != wire.SECAGG_WEIGHT:
        raise RuntimeError(f"the server's SecAgg+ max_weight {values.get(Key.MAX_WEIGHT)} differs from every "
                           f"node's weight {wire.SECAGG_WEIGHT}")


@dataclass(frozen=True)
class SecAggRequest:
    """A collect-stage request the node checked against its own plan: the round, the users as sent
    (each still to be checked: ``client.app.answer_once``) and the instructions."""

    own: NodePlan
    fitins: FitIns
    round_idx: int
    users: list[str]


def checked_request(spec: RunConfig, msg: Message, context: Context) -> SecAggRequest:
    """SecAgg+'s collect-stage request (``secaggplus_mod`` masks the reply), refused where the
    server's setup (the mod's state in ``context``) or its noise differs from the node's own plan
    (:func:`node_plan`): a server asking for less noise, another field or a clear sum where the
    node's mechanism adds noise."""
    own = node_plan(spec)
    _check_protocol(own.sums, context.state.config_records.get(RECORD_KEY_STATE))  # the setup the mod keeps
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    conf = fitins.config
    if own.codec is not None:  # this node is a party of the distributed discrete Gaussian
        if wire.ROUND_KEY not in conf or not own.codec.matches(str(conf.get(wire.CODEC, ""))):
            raise RuntimeError("the server's distributed discrete Gaussian is missing or differs from the one this "
                               "node plans from the run's config")
    elif wire.ROUND_KEY in conf:
        raise RuntimeError("the server asked for distributed noise; this run's mechanism adds it at the server")
    return SecAggRequest(own, fitins, int(conf[wire.ROUND]), wire.users_of(conf[wire.USERS]))


def masked_reply(task: Task, msg: Message, request: SecAggRequest, users: list[int],
                 rng: ClientRandomness) -> Message:
    """The reply to a checked request for ``users`` (answered once: client/app.py). Central noise:
    the users' updates, each clipped to the node's own C′, summed in user order, one float64 vector.
    Party noise: the party's message in Z_m (:func:`fedpriv.sums.secure_sum.party_message`) as ``r − c``.
    No per-user metric: the mod leaves metrics in the clear."""
    own, conf, round_idx = request.own, request.fitins.config, request.round_idx
    params = torch.from_numpy(np.asarray(parameters_to_ndarrays(request.fitins.parameters)[0],
                                         dtype=np.float32).copy())
    if rng.research is not None:
        # research mode: Flower's stochastic rounding draws from numpy's global generator; seeded from the
        # research key, (round, party), the run stays reproducible. No guarantee rests on these draws (the
        # noise is the server's, or the parties' keyed shares), so a 32-bit legacy seed is acceptable here
        np.random.seed(int(uint64s(rng.research, "secagg rounding", (round_idx, int(conf[wire.PARTY])), 1)[0]
                           % 2 ** 32))
    if own.codec is not None:
        sent = party_message(own.codec, task, params, users, round_idx, bytes(conf[wire.ROUND_KEY]), rng,
                             int(conf[wire.PARTY]))
        vector = sent.message.double() - own.sums.field[1]  # Flower's quantizer maps it back to Z_m
    else:
        total = RoundAggregate.zeros(params.numel(), own.sums.node_clip)
        for update in iter_client_updates(task, params, users, round_idx, rng):
            total.add(update.delta)  # a non-finite update is left out (the server sees only the sum)
        vector = total.total.double()
    # the node's own weight, never the server's: a lower one would scale this message (its noise share) away
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([vector.numpy()]),
                    num_examples=wire.SECAGG_WEIGHT, metrics={})
    return Message(content=compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)
