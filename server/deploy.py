"""The ServerApp of a Flower deployment (``[tool.flwr.app.components] serverapp``), started by
``flwr run`` against a SuperLink (see ``scripts/deploy_local.sh``).

Flower run config: ``experiment`` (a configs/experiment name, or empty for the default),
``overrides`` (Hydra overrides as one shell-quoted string) and ``run-dir`` (where summary.json,
metrics.jsonl, privacy.json and checkpoints go; absolute, since the ServerApp does not run in the
app's directory). ``backend=deployment`` is added: it waits for ``backend.num_supernodes`` nodes
and, only where ``backend.round_timeout`` is set, bounds every round by it (by default a round waits
for every node's reply: how long a node takes depends on its users' data, docs/PRIVACY.md). The
overrides are checked as ``python -m fedpriv.simulate`` checks its command line (:func:`server_config`):
a refused one fails the run with the same one-line message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedpriv.config.compose import check_overrides, deployment_config, deployment_overrides
from fedpriv.release.result_lines import format_result
from fedpriv.plan import preflight_sweep
from fedpriv.round.replies import RoundFn
from fedpriv.runner import RunSession, prepare, train
from server.app import round_fn_for

log = logging.getLogger(__name__)
app = ServerApp()


def deployment_round_fn(session: RunSession, grid: Grid) -> RoundFn:
    """The deployed run's round over ``grid`` under its ``backend=deployment`` settings."""
    backend = session.spec.backend
    return round_fn_for(session, grid, int(backend.num_supernodes), backend.round_timeout,
                        node_wait=float(backend.node_wait_timeout), skip_rounds=int(backend.skip_rounds))


def server_config(run_config: Mapping[str, object]) -> dict:
    """The deployed run's config (:func:`fedpriv.config.compose.deployment_config`), after the checks
    ``python -m fedpriv.simulate`` makes of its command line, by the same functions
    (:func:`fedpriv.config.compose.check_overrides`, :func:`fedpriv.plan.preflight_sweep`): a key given
    twice, a fixed noise multiplier beside a target epsilon, and a setting typed beside
    ``plan=auto`` that the plan replaces (``mechanism=tree``) are refused (``ConfigError``, one
    line: the run fails with it) instead of silently dropped."""
    preflight_sweep(check_overrides(deployment_overrides(run_config)))
    return deployment_config(run_config)


@app.main()
def main(grid: Grid, context: Context) -> None:
    # logs are streamed line by line: no progress bar, one structured line per round
    session = prepare({**server_config(context.run_config), "progress": False, "verbose": True})
    summary = train(session, deployment_round_fn(session, grid))
    print(format_result(summary), flush=True)
    print(f"outputs in {session.spec.run_dir}", flush=True)
