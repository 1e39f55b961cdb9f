"""Flower ClientApp: a thin adapter that unpacks the round's message, runs fedpriv's local
update for each user the message names, and packs the deltas and metrics (wire protocol in
``server/strategy.py``).

Users are virtual clients: any node can compute any sampled user's update (the node is the
compute that simulates the devices). In research mode an update depends only on (research key,
round, user), so the result does not depend on which node ran it; in secure mode each update's
randomness is fresh OS entropy on the node (:class:`fedpriv.randomness.ClientRandomness`). A
reply carries statistics of the user's data beside the delta only when diagnostics are on
(research mode, user-level DP: :func:`fedpriv.config.client_diagnostics_enabled`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key
from flwr.compat.common import recorddict_compat as compat

from fedpriv.aggregation import RoundAggregate
from fedpriv.distributed_dp import DDGaussCodec
from fedpriv.plan import build_plan
from fedpriv.schema import as_dict
from fedpriv.secure_sum import SECAGG_WEIGHT, field_of, party_message

from fedpriv.clipping import UnsupportedLayerError
from fedpriv.codec import decode, refusal_content, train_reply_content
from fedpriv.config import client_diagnostics_enabled, run_config
from fedpriv.randomness import ClientRandomness, uint64s
from fedpriv.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.clients import client_updates, iter_client_updates
from fedpriv.task import load_task
from fedpriv.allocator import retain_freed_memory

log = logging.getLogger(__name__)


def train_reply(spec: RunConfig, msg: Message, rng: ClientRandomness) -> Message:
    """The reply to one ``train`` message under the experiment's resolved typed config ``spec``."""
    task = load_task(spec)
    conf = msg.content["config"]
    params = decode(msg.content["arrays"]["params"])
    diagnostics = client_diagnostics_enabled(spec)
    updates = client_updates(task, params, [int(user) for user in conf["users"]], int(conf["round"]), rng, diagnostics)
    return Message(content=train_reply_content(updates), reply_to=msg)


def secure_aggregation_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's ``secaggplus_mod`` for the messages of its protocol (they carry its stage); every
    other message passes through (:func:`reply` refuses a clear round where the run asked for
    secure aggregation)."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


ANSWERED = "fedpriv.answered"  # the node's memory in Flower's Context.state: run id -> the rounds it answered


def answer_once(spec: RunConfig, context: Context, round_idx: int, users: list[int]) -> None:
    """What a node checks itself before it computes a round, whatever the server asks
    (``RuntimeError``, which Flower sends back as an error reply, otherwise):

    * each user at most once: a repeated user would be released more than once in one round (under
      ``client.dp=example``, one noisy release each; in a ``ddgauss`` party's message, its update
      counted several times against one noise share);
    * a round of this run (0 ≤ round < ``rounds``), answered at most once: every answer carries fresh
      noise (example-level DP, a party's share), so a round asked again would let the server average
      it away. Within a SecAgg+ round this is its one fit (the masked-vector stage), not the
      protocol's other stages. The rounds answered are kept in ``context.state`` (per Flower run; it
      lives with the node between the messages of a run, also where each message starts a new
      process) and recorded before the reply is computed."""
    if len(set(users)) != len(users):
        raise RuntimeError(f"round {round_idx + 1}: the server asked for a user more than once; this node "
                           "computes each user at most once a round")
    if not 0 <= round_idx < spec.rounds:
        raise RuntimeError(f"the server asked for round {round_idx + 1}; this run has {spec.rounds} rounds")
    record = context.state.config_records.get(ANSWERED)
    run = str(context.run_id)
    answered = [int(r) for r in record.get(run, [])] if record is not None else []
    if round_idx in answered:
        raise RuntimeError(f"the server asked for round {round_idx + 1} again; this node answers each round "
                           "once (a second answer would release its users again, with fresh noise)")
    context.state.config_records[ANSWERED] = ConfigRecord({**(dict(record) if record else {}),
                                                           run: [*answered, round_idx]})


def reply(spec: RunConfig, msg: Message, rng: ClientRandomness, context: Context) -> Message:
    """The reply to a ``train`` message under ``spec``: a clear round's per-user deltas, or under
    ``aggregation=secagg`` the node's clipped sum (or party message) for SecAgg+ (a clear round is
    then an error: the node never sends its users' updates in the clear). Either way the node
    answers each round once and each user once (:func:`answer_once`)."""
    if spec.aggregation != "secagg":
        conf = msg.content["config"]
        answer_once(spec, context, int(conf["round"]), [int(user) for user in conf["users"]])
        return train_reply(spec, msg, rng)
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        raise RuntimeError("this run aggregates securely (aggregation=secagg), but the server asked for a clear round")
    return secure_sum_reply(spec, msg, rng, context)


@dataclass(frozen=True)
class NodePlan:
    """What a node of a secure run derives from the run's public config itself (its own plan),
    never from the server's messages: the distributed mechanism's codec (``mechanism=ddgauss``) or
    the bound C′ its users are clipped to (central noise), SecAgg+'s field ``(Q, c, M)`` and its
    ``sizes`` (shares, threshold: the threshold at least ``min_shares`` under distributed noise)."""

    codec: DDGaussCodec | None
    clip: float | None
    field: tuple[int, float, int]
    sizes: tuple[int, int]


_PLANS: dict[str, NodePlan] = {}


def node_plan(spec: RunConfig) -> NodePlan:
    """:class:`NodePlan` of ``spec``, planned once per config (σ calibrated to the target ε, the
    run's fixed grid: :func:`fedpriv.secure_sum.secagg_quantization`)."""
    text = json.dumps(as_dict(spec), sort_keys=True, default=str)
    if text not in _PLANS:
        if len(_PLANS) >= 4:  # a long-lived node: keep the last few runs' plans
            _PLANS.pop(next(iter(_PLANS)))
        plan = build_plan(spec, load_task(spec))
        if spec.mechanism.client_noise:  # the plan's (key-less) mechanism at the calibrated σ
            codec = plan.ledger.mechanism.codec()
            _PLANS[text] = NodePlan(codec, None, field_of(codec), plan.secagg_sizes)
        else:
            q = plan.quantization
            _PLANS[text] = NodePlan(None, q.node_clip, (q.levels, q.coordinate_range, q.modulus), plan.secagg_sizes)
    return _PLANS[text]


def _check_protocol(own: NodePlan, values: Mapping[str, Any] | None) -> None:
    """SecAgg+'s settings as the server sent them at setup (``values``: what the mod keeps in its
    state) must be the node's own, checked before the node hands the mod the one message that carries
    its users (the masked vector; a node that refuses sends none, so no sum holds it under settings
    it did not plan): another quantization or field would change what the sum means (or its
    sensitivity); a threshold other than the plan's could unmask a sum with fewer noise shares than
    the accounting assumes (below ``min_shares``); more shares than planned, or a ``max_weight``
    other than :data:`~fedpriv.secure_sum.SECAGG_WEIGHT` (Flower scales a node's vector by its weight
    over it), would change whose messages the sum holds, and how much of each."""
    levels, coordinate_range, modulus = own.field
    shares, threshold = own.sizes
    if (values is None or int(values[Key.TARGET_RANGE]) != levels or int(values[Key.MOD_RANGE]) != modulus
            or not math.isclose(float(values[Key.CLIPPING_RANGE]), coordinate_range, rel_tol=1e-12)):
        raise RuntimeError(f"the server's SecAgg+ settings differ from this node's plan (levels {levels}, range "
                           f"{coordinate_range:g}, field {modulus})")
    if int(values[Key.THRESHOLD]) != threshold or not threshold <= int(values[Key.SHARE_NUMBER]) <= shares:
        raise RuntimeError(f"the server's SecAgg+ threshold {values[Key.THRESHOLD]} of {values[Key.SHARE_NUMBER]} "
                           f"shares differs from this node's plan (threshold {threshold} of at most {shares} shares)")
    if float(values.get(Key.MAX_WEIGHT, math.nan)) != SECAGG_WEIGHT:
        raise RuntimeError(f"the server's SecAgg+ max_weight {values.get(Key.MAX_WEIGHT)} differs from every "
                           f"node's weight {SECAGG_WEIGHT}")


def secure_sum_reply(spec: RunConfig, msg: Message, rng: ClientRandomness, context: Context) -> Message:
    """``aggregation=secagg``: the reply to SecAgg+'s collect stage (``secaggplus_mod`` masks it).
    Central noise: the node's users' updates, each clipped to the node's own C′, summed in user
    order, one float64 vector. ``mechanism=ddgauss``: the party's message in Z_m
    (:func:`fedpriv.secure_sum.party_message`) as ``r − c``. What the node does follows its own
    plan (:func:`node_plan`); a server whose instructions differ is refused. No per-user metric:
    the mod leaves metrics in the clear."""
    task = load_task(spec)
    own = node_plan(spec)
    _check_protocol(own, context.state.config_records.get(RECORD_KEY_STATE))  # the setup the mod keeps
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    conf = fitins.config
    users, round_idx = [int(u) for u in str(conf["users"]).split(",") if u], int(conf["round"])
    if own.codec is not None:  # this node is a party of the distributed discrete Gaussian
        if "ddgauss_round_key" not in conf or not own.codec.matches(str(conf.get("ddgauss_codec", ""))):
            raise RuntimeError("the server's distributed discrete Gaussian is missing or differs from the one this "
                               "node plans from the run's config")
    elif "ddgauss_round_key" in conf:
        raise RuntimeError("the server asked for distributed noise; this run's mechanism adds it at the server")
    answer_once(spec, context, round_idx, users)
    params = torch.from_numpy(np.asarray(parameters_to_ndarrays(fitins.parameters)[0], dtype=np.float32).copy())
    if rng.research is not None:
        # research mode: Flower's stochastic rounding draws from numpy's global generator; seeded from the
        # research key, (round, party), the run stays reproducible. No guarantee rests on these draws (the
        # noise is the server's, or the parties' keyed shares), so a 32-bit legacy seed is acceptable here
        np.random.seed(int(uint64s(rng.research, "secagg rounding", (round_idx, int(conf["party"])), 1)[0] % 2 ** 32))
    if own.codec is not None:
        sent = party_message(own.codec, task, params, users, round_idx, bytes(conf["ddgauss_round_key"]), rng,
                             int(conf["party"]))
        vector = sent.message.double() - own.field[1]  # Flower's quantizer maps it back to Z_m
    else:
        total = RoundAggregate.zeros(params.numel(), own.clip)
        for update in iter_client_updates(task, params, users, round_idx, rng):
            total.add(update.delta)  # a non-finite update is left out (the server sees only the sum)
        vector = total.total.double()
    # the node's own weight, never the server's: a lower one would scale this message (its noise share) away
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([vector.numpy()]),
                    num_examples=SECAGG_WEIGHT, metrics={})
    return Message(content=compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the Hydra config, parsed once here);
    under ``aggregation=secagg`` its rounds run behind Flower's ``secaggplus_mod``."""
    spec = run_config(cfg)
    rng = client_randomness(spec)
    retain_freed_memory()  # clients reallocate the same large tensors every step (fedpriv.allocator)
    app = ClientApp(mods=[secure_aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        try:  # the users to simulate come with the message; the context holds SecAgg+'s state
            return reply(spec, msg, rng, context)
        except UnsupportedLayerError as err:  # the engine refused the model (e.g. its forward mixes samples)
            log.error("the per-sample clipping engine refused the model: %s", err)  # the node's own log
            if spec.aggregation == "secagg":  # SecAgg+ carries no refusal: the node fails (its round halts)
                raise
            return Message(content=refusal_content(type(err).__name__, _layer(str(err))), reply_to=msg)

    return app


def _layer(message: str) -> str:
    """The ``path (Type)`` a refusal's message starts with, or empty: the rest of the message (shapes,
    the batch's sample indices) stays in the node's log."""
    head = message.split(":", 1)[0]
    return head if re.fullmatch(r"[\w.<>' -]+ \([\w.]+\)", head) else ""
