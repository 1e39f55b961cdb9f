"""Flower ServerApp for fedpriv and the two simulation backends.

``backend=local`` runs the round loop in this process (the clients stream into the aggregate; no
messages, no Ray); ``backend=flower`` runs the ServerApp and ClientApp under Flower's simulation
engine. :class:`server.grid.LocalGrid` (an in-process Flower grid) serves the tests of the message path.
"""

from __future__ import annotations

import logging
import os
import time
import warnings

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedpriv.backends import client_app_factory
from fedpriv.round.clients import in_process_round_fn
from fedpriv.errors import ConfigError
from fedpriv.round.replies import ClientReplies, RoundFn, RoundInputs
from fedpriv.runner import RunSession, train
from fedpriv.sums.secure_sum import distributed_round_fn
from fedpriv.schema import FlowerBackend
from fedpriv.sums import party_codec
from server.secagg import secagg_round_fn
from server.strategy import CohortStrategy

log = logging.getLogger(__name__)


def wait_for_nodes(grid: Grid, count: int, timeout: float = 120.0) -> list[int]:
    """Node ids once at least ``count`` nodes are connected (Flower registers them asynchronously);
    after ``timeout`` seconds, those connected so far (possibly none)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)


def grid_round_fn(grid: Grid, num_nodes: int, timeout: float | None, node_wait: float = 120.0,
                  skip_rounds: int = 10) -> RoundFn:
    """A round over a Flower grid: configure (the round's inputs: its cohort and the parameters
    clients start from) → send_and_receive (bounded by ``timeout``) → the clients' replies.

    Waits for ``num_nodes`` nodes before the first round; every round then uses the nodes
    connected at that moment. Users whose node does not reply within ``timeout`` (None: no
    deadline; Flower still ends a message to a node it cannot reach) count as dropped (the
    denominator is fixed; the accounting assumes a node's lateness does not depend on its users'
    data, which a deadline below a busy node's time breaks: docs/PRIVACY.md), and that node gets no users for
    the next ``skip_rounds`` rounds unless no other node is left (the SuperLink itself notices a
    dead node only after its heartbeat expires). No node at all is an error, never an endless wait.
    """
    strategy = CohortStrategy()
    nodes = wait_for_nodes(grid, num_nodes, node_wait)
    if not nodes:
        raise RuntimeError(f"no Flower node connected within {node_wait:g} s")
    if len(nodes) < num_nodes:
        log.warning("only %d of %d nodes connected; starting with them", len(nodes), num_nodes)

    missed: dict[int, int] = {}  # node -> the last round it did not reply in time

    def round_fn(inputs: RoundInputs) -> ClientReplies:
        round_idx = inputs.round_idx
        current = wait_for_nodes(grid, 1, node_wait)  # returns at once while any node is connected
        if not current:
            raise RuntimeError(f"round {round_idx + 1}: no Flower node connected")
        healthy = [n for n in current if round_idx - missed.get(int(n), -10**9) > skip_rounds] or current
        messages = strategy.configure_train(round_idx, inputs.cohort, inputs.params, healthy)
        updates = strategy.aggregate_train(grid.send_and_receive(messages, timeout=timeout))
        # sent this round, no reply by the deadline (without one: Flower gave up on the node, e.g. it is unreachable)
        late = f"within {timeout:g} s" if timeout is not None else "(no deadline: Flower reported no reply)"
        for node in strategy.sent:
            missed[node] = round_idx
            # no user count in the log: it would publish a share of the (secret) cohort size
            log.warning("round %d: node %d did not reply %s: its users count as dropped; no users "
                        "for it in the next %d rounds", round_idx + 1, node, late, skip_rounds)
        return ClientReplies(updates)

    return round_fn


def round_fn_for(session: RunSession, grid: Grid | None = None, num_nodes: int = 0, timeout: float | None = None,
                 node_wait: float = 120.0, skip_rounds: int = 10) -> RoundFn:
    """The run's round, chosen from its sum plan (``session.plan.sums``, :mod:`fedpriv.sums`): the
    server's one dispatch on the trust model. Without a ``grid`` (``backend=local``): in this
    process, the parties' secure sum simulated where they add the noise
    (:func:`fedpriv.sums.secure_sum.distributed_round_fn`), else the clear round (:func:`_local_round_fn`).
    Over a Flower grid: clear per-user replies (:func:`grid_round_fn`), or the nodes' sums through
    SecAgg+ (``aggregation=secagg``: :func:`server.secagg.secagg_round_fn`, on the ``num_nodes``
    nodes connected before round 1; with the parties' codec where they add the noise)."""
    sums = session.plan.sums
    protocol, codec = sums.protocol, party_codec(sums, session.server.mechanism)
    rotation = session.keyed.rotation_key if codec is not None else None
    if grid is None:
        dropout_key = session.keyed.dropout_key  # client.dropout_rate's draws (secret in secure mode)
        if codec is not None:  # the parties add the noise, a simulated secure sum reveals the total
            return distributed_round_fn(session.task, session.spec, session.server.mechanism, rotation, dropout_key)
        return _local_round_fn(session, dropout_key)
    if protocol == "plain":
        return grid_round_fn(grid, num_nodes, timeout, node_wait=node_wait, skip_rounds=skip_rounds)
    nodes = sorted(int(n) for n in wait_for_nodes(grid, num_nodes, node_wait))
    if len(nodes) < num_nodes:
        raise RuntimeError(f"secure aggregation needs its {num_nodes} nodes; {len(nodes)} connected within "
                           f"{node_wait:g} s")
    nodes = nodes[:num_nodes]  # exactly the planned parties (the capacity and the shares are sized for them)
    return secagg_round_fn(grid, nodes, sums, sums.timeout if sums.timeout is not None else timeout, codec, rotation)


def make_server_app(session: RunSession, num_nodes: int, result: dict) -> ServerApp:
    """A ServerApp running ``session``; the summary lands in ``result['summary']`` (a ``ConfigError``
    that stopped the run, in ``result['error']``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        del context
        timeout = getattr(session.spec.backend, "round_timeout", None)
        try:
            result["summary"] = train(session, round_fn_for(session, grid, num_nodes, timeout))
        except ConfigError as err:  # a client refused the model mid-run: raised again after the engine stops
            result["error"] = err

    return app


def run_local(session: RunSession) -> dict:
    """``backend=local``: the round loop in this process (:func:`round_fn_for` without a grid)."""
    return train(session, round_fn_for(session))


def _local_round_fn(session: RunSession, dropout_key: bytes) -> RoundFn:
    """The clear round in this process: the one-pass batched round (DP-FedSGD, DP-SGD) where the
    algorithm allows it, else the clients streamed into the aggregate one by one
    (:func:`fedpriv.round.clients.in_process_round_fn`: what the ClientApp computes, without the
    message's copies). ``backend=flower`` and deployments carry the same deltas in Flower
    messages (tests: the same model, bit for bit)."""
    task = session.task
    batched = task.algorithm.batched_round(task.client_model, task.local, task.data.vocab.pad_id, task.units)
    if batched is not None:
        return batched
    return in_process_round_fn(task, session.spec, dropout_key)


def _not_run_simulation_deprecation(record: logging.LogRecord) -> bool:
    """Flower's notice, on every run, that ``run_simulation`` (what ``backend=flower`` is) is deprecated."""
    return "The `run_simulation` function is deprecated" not in record.getMessage()


def library_logging(shown: bool = False) -> dict[str, str | bool]:
    """The console keeps fedpriv's own lines under Flower's engine (``backend.library_logs``):
    Flower's and Ray's loggers pass only their errors (``shown``: their warnings too); Flower's
    notice that ``run_simulation`` (what ``backend=flower`` is) is deprecated and Ray's tip about
    accelerator variables never. The simulated nodes' output (Ray's workers: Flower's SecAgg+ stage
    lines, the libraries' notes, a client's traceback) stays in Ray's own logs unless ``shown``; a
    client's failure still reaches the console through Flower's error on the server's side.
    Importing flwr or Ray resets their loggers, so this runs after those imports. Returns the
    ``ray.init`` arguments of the same choice. fedpriv's loggers are not touched."""
    level = logging.WARNING if shown else logging.ERROR
    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(level)
    if _not_run_simulation_deprecation not in flwr_log.filters:
        flwr_log.addFilter(_not_run_simulation_deprecation)
    logging.getLogger("ray").setLevel(level)  # and by ray.init(logging_level=...) when the engine starts
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
    return {"logging_level": logging.getLevelName(level), "log_to_driver": shown}


def client_resources(backend: FlowerBackend) -> dict[str, float]:
    """What Ray reserves for each simulated node: CPUs, and GPUs with ``backend.client_gpus > 0``
    (Ray then makes that GPU the worker's only visible CUDA device, where ``device=auto`` finds it)."""
    resources = {"num_cpus": float(backend.client_cpus)}
    if float(backend.client_gpus or 0) > 0:
        resources["num_gpus"] = float(backend.client_gpus)
    return resources


def run_flower_simulation(session: RunSession) -> dict:
    """``backend=flower``: the same apps under ``flwr.simulation.run_simulation`` (Ray)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    from flwr.simulation import run_simulation  # lazy: Ray, only for backend=flower

    backend = session.spec.backend
    ray_logging = library_logging(backend.library_logs)
    num_nodes = int(backend.num_supernodes)
    result: dict = {}
    run_simulation(server_app=make_server_app(session, num_nodes, result),
                   client_app=client_app_factory()(session.cfg), num_supernodes=num_nodes,
                   backend_config={"client_resources": client_resources(backend),
                                   "init_args": {"num_cpus": int(backend.num_cpus), "include_dashboard": False,
                                                 **ray_logging}})
    if "error" in result:
        raise result["error"]
    if "summary" not in result:
        raise RuntimeError("Flower simulation ended without a result (see the log above)")
    return result["summary"]

