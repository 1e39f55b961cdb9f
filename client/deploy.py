"""The ClientApp of a Flower deployment (``[tool.flwr.app.components] clientapp``): the
experiment comes from Flower's run config (``experiment``, ``overrides``), composed from the
same Hydra tree as ``fedpriv.simulate`` (:func:`fedpriv.config.compose.deployment_config`).

Node setting (Flower's node config, ``flower-supernode --node-config``): ``state-dir``, the
directory where the node remembers the rounds it answered in secure mode, across Flower runs and
SuperNode restarts (:func:`client.app.node_state_dir`: default ``node-state`` under fedpriv's
cache; docs/PRIVACY.md "What a node checks itself")."""

from __future__ import annotations

import functools
import json

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.app import NodeMemory, config_digest, node_state_dir, reply
from client.secagg import secure_aggregation_mod
from fedpriv.config.compose import deployment_config
from fedpriv.config.resolve import run_config
from fedpriv.plan import executed_config
from fedpriv.keys.randomness import ClientRandomness
from fedpriv.keys.research_key import client_randomness
from fedpriv.schema import RunConfig
from fedpriv.task import load_task

app = ClientApp(mods=[secure_aggregation_mod])


@functools.lru_cache(maxsize=4)
def _config(run_config_json: str) -> tuple[RunConfig, ClientRandomness, str]:
    """The run's resolved typed config (parsed once per node; the config the server executes,
    :func:`fedpriv.plan.executed_config`), where this node's randomness comes from (OS entropy in
    secure mode, the deployment default: the node never learns anything that regenerates server
    noise or cohorts) and the config's digest (:func:`client.app.config_digest`)."""
    spec = run_config(deployment_config(json.loads(run_config_json)))
    # what the server executes (the plan applied, the mechanism fitted: public values only): the
    # rounds the clients' example-level DP is set for, and in research mode the key of its config.yaml
    spec = executed_config(spec, load_task(spec))
    return spec, client_randomness(spec), config_digest(spec)


@app.train()
def train(msg: Message, context: Context) -> Message:
    spec, rng, digest = _config(json.dumps(dict(context.run_config), sort_keys=True, default=str))
    # secure mode: the rounds answered are remembered on the node's disk, whatever the Flower run. Research
    # mode needs no such memory against the server, which holds the research key: a round asked again
    # draws the same keys, and the server can regenerate every client's noise from the config itself
    memory = NodeMemory(node_state_dir(context.node_config), digest) if spec.secure else None
    return reply(spec, msg, rng, context, memory)
