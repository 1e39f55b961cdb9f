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

import logging
import re

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedpriv.clipping import UnsupportedLayerError
from fedpriv.codec import decode, refusal_content, train_reply_content
from fedpriv.config import client_diagnostics_enabled, run_config
from fedpriv.randomness import ClientRandomness
from fedpriv.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.clients import client_updates
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


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the Hydra config, parsed once here)."""
    spec = run_config(cfg)
    rng = client_randomness(spec)
    retain_freed_memory()  # clients reallocate the same large tensors every step (fedpriv.allocator)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        del context  # the users to simulate come with the message, not from the node
        try:
            return train_reply(spec, msg, rng)
        except UnsupportedLayerError as err:  # the engine refused the model (e.g. its forward mixes samples)
            log.error("the per-sample clipping engine refused the model: %s", err)  # the node's own log
            return Message(content=refusal_content(type(err).__name__, _layer(str(err))), reply_to=msg)

    return app


def _layer(message: str) -> str:
    """The ``path (Type)`` a refusal's message starts with, or empty: the rest of the message (shapes,
    the batch's sample indices) stays in the node's log."""
    head = message.split(":", 1)[0]
    return head if re.fullmatch(r"[\w.<>' -]+ \([\w.]+\)", head) else ""
