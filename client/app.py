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
import re

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedpriv.aggregation import RoundAggregate
from fedpriv.distributed_dp import DDGaussCodec
from fedpriv.plan import build_plan
from fedpriv.schema import as_dict
from fedpriv.secure_sum import party_message

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


def reply(spec: RunConfig, msg: Message, rng: ClientRandomness) -> Message:
    """The reply to a ``train`` message under ``spec``: a clear round's per-user deltas, or under
    ``aggregation=secagg`` the node's clipped sum for SecAgg+ (a clear round is then an error: the
    node never sends its users' updates in the clear)."""
    if spec.aggregation != "secagg":
        return train_reply(spec, msg, rng)
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        raise RuntimeError("this run aggregates securely (aggregation=secagg), but the server asked for a clear round")
    return secure_sum_reply(spec, msg, rng)


def secure_sum_reply(spec: RunConfig, msg: Message, rng: ClientRandomness) -> Message:
    """``aggregation=secagg``: the reply to SecAgg+'s collect stage (``secaggplus_mod`` masks it):
    the node's users' updates, each clipped to the ``clip`` the server sent (C′, server/secagg.py),
    summed in user order, as one float64 vector at the server's weight. No per-user metric: the
    mod leaves metrics in the clear."""
    task = load_task(spec)
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    conf = fitins.config
    params = torch.from_numpy(np.asarray(parameters_to_ndarrays(fitins.parameters)[0], dtype=np.float32).copy())
    users, round_idx = [int(u) for u in str(conf["users"]).split(",") if u], int(conf["round"])
    if rng.research is not None:
        # research mode: Flower's stochastic rounding draws from numpy's global generator; seeded from the
        # research key, (round, party), the run stays reproducible. No guarantee rests on these draws (the
        # noise is the server's, or the parties' keyed shares), so a 32-bit legacy seed is acceptable here
        np.random.seed(int(uint64s(rng.research, "secagg rounding", (round_idx, int(conf["party"])), 1)[0] % 2 ** 32))
    if "ddgauss_round_key" in conf:  # this node is a party of the distributed discrete Gaussian
        codec = party_codec(spec)
        if str(conf["ddgauss_codec"]) != codec.digest():  # never adopt the server's: refuse a mismatch
            raise RuntimeError("the server's distributed discrete Gaussian differs from the one this node plans from "
                               f"the run's config ({conf['ddgauss_codec']} against {codec.digest()})")
        sent = party_message(codec, task, params, users, round_idx, bytes(conf["ddgauss_round_key"]), rng,
                             int(conf["party"]))
        vector = sent.message.double() - (codec.modulus - 1) / 2.0  # Flower's quantizer maps it back to Z_m
    else:
        total = RoundAggregate.zeros(params.numel(), float(conf["clip"]))
        for update in iter_client_updates(task, params, users, round_idx, rng):
            total.add(update.delta)  # a non-finite update is left out (the server sees only the sum)
        vector = total.total.double()
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([vector.numpy()]),
                    num_examples=int(float(conf["max_weight"])), metrics={})
    return Message(content=compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)


_CODECS: dict[str, DDGaussCodec] = {}


def party_codec(spec: RunConfig) -> DDGaussCodec:
    """The distributed discrete Gaussian a party encodes with, derived by the node from the run's
    public config (its own plan: σ calibrated to the target ε), never read from the server's
    round messages (a mismatch is refused: the digest check in :func:`secure_sum_reply`). Planned
    once per config."""
    text = json.dumps(as_dict(spec), sort_keys=True, default=str)
    if text not in _CODECS:
        if len(_CODECS) >= 4:  # a long-lived node: keep the last few runs' codecs
            _CODECS.pop(next(iter(_CODECS)))
        plan = build_plan(spec, load_task(spec))
        sampler = plan.ledger.sampler
        mechanism = plan.spec.mechanism.build(plan.noise_multiplier, plan.mechanism_clip, rounds=plan.spec.rounds,
                                              sampler=sampler, dimension=plan.ledger.dimension)
        _CODECS[text] = mechanism.codec()
    return _CODECS[text]


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the Hydra config, parsed once here);
    under ``aggregation=secagg`` its rounds run behind Flower's ``secaggplus_mod``."""
    spec = run_config(cfg)
    rng = client_randomness(spec)
    retain_freed_memory()  # clients reallocate the same large tensors every step (fedpriv.allocator)
    app = ClientApp(mods=[secure_aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        del context  # the users to simulate come with the message, not from the node
        try:
            return reply(spec, msg, rng)
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
