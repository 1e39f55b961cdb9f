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
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat

from fedpriv.aggregation import RoundAggregate
from fedpriv.distributed_dp import DDGaussCodec
from fedpriv.plan import build_plan
from fedpriv.schema import as_dict
from fedpriv.secure_sum import field_of, party_message

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


def reply(spec: RunConfig, msg: Message, rng: ClientRandomness, context: Context | None = None) -> Message:
    """The reply to a ``train`` message under ``spec``: a clear round's per-user deltas, or under
    ``aggregation=secagg`` the node's clipped sum (or party message) for SecAgg+ (a clear round is
    then an error: the node never sends its users' updates in the clear)."""
    if spec.aggregation != "secagg":
        return train_reply(spec, msg, rng)
    if RECORD_KEY_CONFIGS not in msg.content.config_records or context is None:
        raise RuntimeError("this run aggregates securely (aggregation=secagg), but the server asked for a clear round")
    return secure_sum_reply(spec, msg, rng, context)


@dataclass(frozen=True)
class NodePlan:
    """What a node of a secure run derives from the run's public config itself (its own plan),
    never from the server's messages: the distributed mechanism's codec (``mechanism=ddgauss``) or
    the bound C′ its users are clipped to (central noise), and SecAgg+'s field ``(Q, c, M)``."""

    codec: DDGaussCodec | None
    clip: float | None
    field: tuple[int, float, int]


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
            _PLANS[text] = NodePlan(codec, None, field_of(codec))
        else:
            q = plan.quantization
            _PLANS[text] = NodePlan(None, q.node_clip, (q.levels, q.coordinate_range, q.modulus))
    return _PLANS[text]


def _check_protocol(own: NodePlan, context: Context) -> None:
    """The SecAgg+ settings the server sent at setup (kept in the mod's state) must be the node's
    own: another quantization or field would change what the sum means (or its sensitivity)."""
    state = context.state.config_records.get(RECORD_KEY_STATE)
    levels, coordinate_range, modulus = own.field
    if (state is None or int(state["target_range"]) != levels or int(state["mod_range"]) != modulus
            or not math.isclose(float(state["clipping_range"]), coordinate_range, rel_tol=1e-12)):
        raise RuntimeError(f"the server's SecAgg+ settings differ from this node's plan (levels {levels}, range "
                           f"{coordinate_range:g}, field {modulus})")


def secure_sum_reply(spec: RunConfig, msg: Message, rng: ClientRandomness, context: Context) -> Message:
    """``aggregation=secagg``: the reply to SecAgg+'s collect stage (``secaggplus_mod`` masks it).
    Central noise: the node's users' updates, each clipped to the node's own C′, summed in user
    order, one float64 vector. ``mechanism=ddgauss``: the party's message in Z_m
    (:func:`fedpriv.secure_sum.party_message`) as ``r − c``. What the node does follows its own
    plan (:func:`node_plan`); a server whose instructions differ is refused. No per-user metric:
    the mod leaves metrics in the clear."""
    task = load_task(spec)
    own = node_plan(spec)
    _check_protocol(own, context)
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    conf = fitins.config
    params = torch.from_numpy(np.asarray(parameters_to_ndarrays(fitins.parameters)[0], dtype=np.float32).copy())
    users, round_idx = [int(u) for u in str(conf["users"]).split(",") if u], int(conf["round"])
    if rng.research is not None:
        # research mode: Flower's stochastic rounding draws from numpy's global generator; seeded from the
        # research key, (round, party), the run stays reproducible. No guarantee rests on these draws (the
        # noise is the server's, or the parties' keyed shares), so a 32-bit legacy seed is acceptable here
        np.random.seed(int(uint64s(rng.research, "secagg rounding", (round_idx, int(conf["party"])), 1)[0] % 2 ** 32))
    if own.codec is not None:  # this node is a party of the distributed discrete Gaussian
        if "ddgauss_round_key" not in conf or not own.codec.matches(str(conf.get("ddgauss_codec", ""))):
            raise RuntimeError("the server's distributed discrete Gaussian is missing or differs from the one this "
                               "node plans from the run's config")
        sent = party_message(own.codec, task, params, users, round_idx, bytes(conf["ddgauss_round_key"]), rng,
                             int(conf["party"]))
        vector = sent.message.double() - own.field[1]  # Flower's quantizer maps it back to Z_m
    else:
        if "ddgauss_round_key" in conf:
            raise RuntimeError("the server asked for distributed noise; this run's mechanism adds it at the server")
        total = RoundAggregate.zeros(params.numel(), own.clip)
        for update in iter_client_updates(task, params, users, round_idx, rng):
            total.add(update.delta)  # a non-finite update is left out (the server sees only the sum)
        vector = total.total.double()
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([vector.numpy()]),
                    num_examples=int(float(conf["max_weight"])), metrics={})
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
