"""The ServerApp of a Flower deployment (``[tool.flwr.app.components] serverapp``), started by
``flwr run`` against a SuperLink (see ``scripts/deploy_local.sh``).

Flower run config: ``experiment`` (a configs/experiment name, or empty for the default),
``overrides`` (Hydra overrides as one shell-quoted string) and ``run-dir`` (where summary.json,
metrics.jsonl, privacy.json and checkpoints go; absolute, since the ServerApp does not run in the
app's directory). ``backend=deployment`` is added: it waits for ``backend.num_supernodes`` nodes
and, only where ``backend.round_timeout`` is set, bounds every round by it (by default a round waits
for every node's reply: how long a node takes depends on its users' data, docs/PRIVACY.md).
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedpriv.compose import deployment_config
from fedpriv.console import format_result
from fedpriv.replies import RoundFn
from fedpriv.runner import RunSession, prepare, train
from server.app import round_fn_for

log = logging.getLogger(__name__)
app = ServerApp()


def deployment_round_fn(session: RunSession, grid: Grid) -> RoundFn:
    """The deployed run's round over ``grid`` under its ``backend=deployment`` settings."""
    backend = session.spec.backend
    return round_fn_for(session, grid, int(backend.num_supernodes), backend.round_timeout,
                        node_wait=float(backend.node_wait_timeout), skip_rounds=int(backend.skip_rounds))


@app.main()
def main(grid: Grid, context: Context) -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting: per-order RDP convergence notes
    # logs are streamed line by line: no progress bar, one structured line per round
    session = prepare({**deployment_config(context.run_config), "progress": False, "verbose": True})
    summary = train(session, deployment_round_fn(session, grid))
    print(format_result(summary), flush=True)
    print(f"outputs in {session.spec.run_dir}", flush=True)
