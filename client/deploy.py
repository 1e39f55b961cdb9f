"""The ClientApp of a Flower deployment (``[tool.flwr.app.components] clientapp``): the
experiment comes from Flower's run config (``experiment``, ``overrides``), composed from the
same Hydra tree as ``fedpriv.simulate`` (:func:`fedpriv.compose.deployment_config`)."""

from __future__ import annotations

import functools
import json

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.app import train_reply
from fedpriv.compose import deployment_config

app = ClientApp()


@functools.lru_cache(maxsize=4)
def _config(run_config_json: str) -> dict:
    return deployment_config(json.loads(run_config_json))


@app.train()
def train(msg: Message, context: Context) -> Message:
    return train_reply(_config(json.dumps(dict(context.run_config), sort_keys=True, default=str)), msg)
