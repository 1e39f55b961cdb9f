"""Flower ClientApp: a thin adapter that unpacks the round's message, runs fedpriv's local
update for the requested user, and packs the delta and metrics."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.codec import decode, encode
from fedpriv.runner import client_update
from fedpriv.task import load_task


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the resolved Hydra config)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        del context  # the user to simulate comes with the message, not from the node
        task = load_task(cfg)
        conf = msg.content["config"]
        params = decode(msg.content["arrays"]["params"])
        update = client_update(task, params, int(conf["user"]), int(conf["round"]))
        content = RecordDict({"delta": ArrayRecord({"delta": encode(update.delta)}),
                              "metrics": MetricRecord({"user": int(conf["user"]), **update.metrics})})
        return Message(content=content, reply_to=msg)

    return app
