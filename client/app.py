"""Flower ClientApp: a thin adapter that unpacks the round's message, runs fedpriv's local
update for each user the message names, and packs the deltas and metrics (wire protocol in
``server/strategy.py``).

Users are virtual clients: any node can compute any sampled user's update (the node is the
compute that simulates the devices), and an update depends only on (seed, round, user), so the
result does not depend on which node ran it.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.codec import decode, train_reply_content
from fedpriv.runner import client_update
from fedpriv.task import load_task


def train_reply(cfg: dict, msg: Message) -> Message:
    """The reply to one ``train`` message under the experiment ``cfg``."""
    task = load_task(cfg)
    conf = msg.content["config"]
    params = decode(msg.content["arrays"]["params"])
    updates = [client_update(task, params, int(user), int(conf["round"])) for user in conf["users"]]
    return Message(content=train_reply_content(updates), reply_to=msg)


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the resolved Hydra config)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        del context  # the users to simulate come with the message, not from the node
        return train_reply(cfg, msg)

    return app
