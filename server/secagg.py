"""The server half of ``aggregation=secagg`` (:mod:`fedpriv.sums.secagg`): each round's node sums
reach the server only as their sum, through Flower's own SecAgg+ (``flwr.server.workflow.SecAggPlusWorkflow``
here, ``secaggplus_mod`` in the node half, client/secagg.py; what both share: :mod:`fedpriv.sums.wire`).
No cryptography is written here, and no DP: the server adds the mechanism's noise to the unmasked
sum as for a plain round (fedpriv.round.dpfedavg).

Flower's SecAgg+ speaks the legacy Strategy API, so each round runs the workflow once with a fresh
``LegacyContext`` and a one-round strategy (:class:`_OneRound`) whose ``configure_fit`` sends every
connected node its users (:func:`server.strategy.assign_users`) and whose ``aggregate_fit`` keeps
what the workflow unmasked. What SecAgg+ computes, and how fedpriv reads it:

* a node sends its users' updates each clipped to ``C′`` and summed (client/secagg.py), with weight
  ``num_examples = max_weight`` (:data:`fedpriv.sums.wire.SECAGG_WEIGHT`, the node's own) so Flower's
  weighting is 1; Flower clips each coordinate to
  ``±c`` (fixed for the run from public quantities: :func:`fedpriv.sums.secagg.secagg_quantization`), maps
  ``[−c, c]`` to ``[0, Q]`` (``Q = 2^bits − 1``) with stochastic rounding, masks, and the server
  unmasks ``Σ`` modulo ``M = 2^modulus_bits`` and returns the *mean* over the surviving nodes:
  fedpriv multiplies it back by their number;
* sensitivity: clipping a coordinate is 1-Lipschitz, and stochastic rounding, coupled over its
  uniforms, moves each coordinate of the difference by less than one step ``2c/Q``, so one
  user's effect on the released sum is at most ``C′ + √d·2c/Q = C`` in L2 (``C′`` is chosen so):
  the ledger's C holds; the rounding's uniforms (numpy's global generator, in Flower) need not be
  secret, the noise is the server's;
* overflow: ``nodes·Q < M`` is required (refused otherwise), so the sum never wraps.

A round in which the protocol halts (fewer than two nodes, or fewer than the threshold) releases
the noise alone: all its users count as dropped. What the server and a node learn: docs/PRIVACY.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat import LegacyContext
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp import Grid

from fedpriv.round.replies import RoundFn, RoundInputs
from fedpriv.sums.secure_sum import SecureSum
from fedpriv.sums import SumPlan, wire
from server.strategy import assign_users

log = logging.getLogger(__name__)


class _OneRound(Strategy):
    """The legacy strategy SecAgg+ drives for one round: it sends each node its instructions and
    keeps the unmasked mean and the nodes that took part."""

    def __init__(self, grid: Grid, fitins: dict[int, FitIns]) -> None:
        self.grid, self.fitins = grid, fitins
        self.mean: np.ndarray | None = None
        self.nodes: list[int] = []

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        del server_round, parameters, client_manager
        run_id = self.grid.run.run_id
        return [(GridClientProxy(node, self.grid, run_id), ins) for node, ins in self.fitins.items()]

    def aggregate_fit(self, server_round, results, failures):
        del server_round, failures
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)[0]
            self.nodes = [int(proxy.node_id) for proxy, _ in results]
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


def unmasked_field_sum(mean: np.ndarray, survivors: int, codec) -> torch.Tensor:
    """``Σ r_i mod m`` from what SecAgg+ returns for field messages (:func:`~fedpriv.sums.wire.field_of`): Flower's
    weights sum to ``n·Q ≡ m − n`` (mod m), so its output is ``y = (S − n·c)·Q/(m − n)``; inverted
    in float64 (exact to far below ½ for m ≤ 2^31) and rounded."""
    q, c, m = wire.field_of(codec)
    summed = np.rint(np.asarray(mean, dtype=np.float64) * (m - survivors) / q + survivors * c)
    return torch.from_numpy(np.mod(summed.astype(np.int64), m)).reshape(-1)


def secagg_round_fn(grid: Grid, nodes: Sequence[int], sums: SumPlan, timeout: float | None = None, codec=None,
                    round_key: bytes | None = None, halt_limit: int = 3) -> RoundFn:
    """A round over ``grid``'s ``nodes`` through SecAgg+ as the run's sum plan ``sums`` has it
    (:func:`fedpriv.sums.plan_sum`, what every node plans too: shares, threshold, the field, the
    nodes' clip) (module docstring): the cohort dealt to the nodes, their clipped sums unmasked as
    one sum (a :class:`SecureSum`); ``timeout`` bounds each of the protocol's stages (a node later
    than it drops out). With the parties' ``codec`` (party noise: ``mechanism=ddgauss``) each node
    is a party: it sends its message in Z_m (its users rounded on the grid rotated by ``round_key``'s
    signs, plus its noise share), SecAgg+ sums the messages mod m, and the server decodes the sum.
    Without one the plan's fixed quantization sets the grid. Each round asks the nodes of ``nodes``
    still connected (users are dealt over all of them by id: a missing node's users count as
    dropped); ``halt_limit`` rounds in a row that halt (every such round releases its noise alone)
    stop the run with an error."""
    nodes = sorted(int(n) for n in nodes)
    if sums.field is None:
        raise ValueError("secure aggregation needs the run's field (its sum plan)")
    if codec is not None and round_key is None:
        raise ValueError("distributed DP through SecAgg+ needs the round's rotation key")
    digest = codec.digest() if codec is not None else ""
    halted = 0  # rounds in a row that halted
    # distributed noise: the plan's threshold is at least min_shares, so only sums that hold the shares the
    # accounting assumes are unmasked (Flower checks the threshold after collecting the masked vectors)
    shares, threshold = sums.shares, sums.threshold
    levels, coordinate_range, modulus = sums.field
    if len(nodes) < 2:
        raise ValueError("secure aggregation needs at least two nodes")

    def round_fn(inputs: RoundInputs) -> SecureSum:
        nonlocal halted
        params = inputs.params
        sent = assign_users(inputs.cohort, nodes)  # over every node of the run: a user's node is its own
        connected = set(int(n) for n in grid.get_node_ids())
        # the nodes' bound C′ (central noise); under party noise the node's message is already on the field
        # (Flower's quantizer leaves it as it is) and its users are clipped to the mechanism's C
        clip = sums.node_clip if sums.node_clip is not None else inputs.clip_norm
        extra = {wire.ROUND_KEY: round_key, wire.CODEC: digest} if codec is not None else {}
        weights = ndarrays_to_parameters([params.detach().cpu().numpy()])
        fitins = {node: FitIns(weights, {wire.ROUND: inputs.round_idx, wire.USERS: wire.users_text(users),
                                         wire.CLIP: clip, wire.PARTY: party, **extra})
                  for party, (node, users) in enumerate(sent.items()) if node in connected}
        strategy = _OneRound(grid, fitins)
        context = LegacyContext(Context(run_id=grid.run.run_id, node_id=0, node_config={}, state=RecordDict(),
                                        run_config={}),
                                config=ServerConfig(num_rounds=1), strategy=strategy,
                                client_manager=SimpleClientManager())
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: inputs.round_idx + 1})
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord([np.zeros(1, dtype=np.float32)])
        # Flower reads an int num_shares as neighbours (> 2, and more than the threshold) and 1.0 as all nodes
        SecAggPlusWorkflow(num_shares=1.0 if shares == len(nodes) else shares, reconstruction_threshold=threshold,
                           max_weight=wire.SECAGG_WEIGHT,
                           clipping_range=coordinate_range, quantization_range=levels, modulus_range=modulus,
                           timeout=timeout)(grid, context)
        if strategy.mean is None:  # the protocol halted: nothing unmasked, every user of the round dropped
            halted += 1
            log.warning("round %d: secure aggregation halted (%d of %d nodes asked; too few answered in a stage); "
                        "the round releases the noise alone", inputs.round_idx + 1, len(fitins), len(nodes))
            if halted >= halt_limit:
                raise RuntimeError(f"secure aggregation halted {halted} rounds in a row: too few of the "
                                   f"{len(nodes)} nodes complete the protocol (a lost node, or a node's error: see "
                                   "its log)")
            return SecureSum(torch.zeros(params.numel()), set(), 0, round_idx=inputs.round_idx)
        halted = 0
        users = {u for node in strategy.nodes for u in sent.get(node, [])}
        if codec is not None:
            field_sum = unmasked_field_sum(strategy.mean, len(strategy.nodes), codec)
            total = codec.decode(field_sum, round_key, inputs.round_idx, params.numel())
        else:
            total = torch.from_numpy(np.asarray(strategy.mean, dtype=np.float64) * len(strategy.nodes))
        return SecureSum(total.to(torch.float32).reshape(-1), users, len(strategy.nodes), round_idx=inputs.round_idx)

    return round_fn
