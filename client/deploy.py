"""The ClientApp of a Flower deployment (``[tool.flwr.app.components] clientapp``): the
experiment comes from Flower's run config (``experiment``, ``overrides``), composed from the
same Hydra tree as ``fedpriv.simulate`` (:func:`fedpriv.compose.deployment_config`)."""

from __future__ import annotations

import functools
import json

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.app import reply, secure_aggregation_mod
from fedpriv.compose import deployment_config
from fedpriv.config import run_config
from fedpriv.plan import executed_config
from fedpriv.randomness import ClientRandomness
from fedpriv.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.task import load_task

app = ClientApp(mods=[secure_aggregation_mod])


@functools.lru_cache(maxsize=4)
def _config(run_config_json: str) -> tuple[RunConfig, ClientRandomness]:
    """The run's resolved typed config (parsed once per node; the config the server executes,
    :func:`fedpriv.plan.executed_config`) and where this node's
    randomness comes from (OS entropy in secure mode, the deployment default: the node never learns
    anything that regenerates server noise or cohorts)."""
    spec = run_config(deployment_config(json.loads(run_config_json)))
    # what the server executes (the plan applied, the mechanism fitted: public values only): the
    # rounds the clients' example-level DP is set for, and in research mode the key of its config.yaml
    spec = executed_config(spec, load_task(spec))
    return spec, client_randomness(spec)


@app.train()
def train(msg: Message, context: Context) -> Message:
    spec, rng = _config(json.dumps(dict(context.run_config), sort_keys=True, default=str))
    return reply(spec, msg, rng, context)
