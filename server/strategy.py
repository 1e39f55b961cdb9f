"""The round's transport as a Flower strategy (no DP here): *configure* builds the round's
messages, *aggregate* turns the replies into ``ClientUpdate``s. All clipping, noise and
accounting happen in ``fedpriv.round.dpfedavg.DPFedAvg``.

Wire protocol (one message per node and round, not per user — a deployed node starts one
ClientApp process per message):

* server → node: ``arrays/params`` (the global model), ``config`` ``{"round": r, "users": [...]}``;
* node → server: ``deltas`` (an ArrayRecord keyed by ``str(user)``) and one MetricRecord
  ``metrics.<user>`` per user; or ``refused`` (:func:`fedpriv.round.codec.refusal_content`) where the
  node's per-sample clipping engine refused the model, which ends the run (a ``ConfigError``).

Attribution never trusts the reply: the users of a reply are those the server sent to the
replying node this round. A user whose delta is missing or malformed gets ``delta=None`` and is
rejected (counted) by DPFedAvg; the users of a node that sent no reply, or an error reply, count
as dropped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedpriv.round.codec import decode, encode, refusal
from fedpriv.errors import ConfigError
from fedpriv.round.replies import ClientUpdate
from fedpriv.sums import assign_parties

log = logging.getLogger(__name__)
TRAIN = "train"


def assign_users(cohort: np.ndarray, node_ids: Sequence[int]) -> dict[int, list[int]]:
    """The cohort dealt to the sorted nodes by the one user→party rule
    (:func:`fedpriv.sums.assign_parties`: user u to node u mod |nodes|, a function of the user
    alone, so one user joining or leaving the cohort moves nobody else; when a node is lost, the
    users lost with it do not depend on who else was sampled: the add/remove pair the accounting
    assumes). Every node gets a message, with no user where it holds none this round: which nodes
    are asked (and so which may miss a deadline and be named in a warning) never depends on the
    cohort."""
    if not node_ids:
        raise RuntimeError("no nodes are connected")
    nodes = sorted(int(n) for n in node_ids)
    return dict(zip(nodes, assign_parties(cohort, len(nodes))))


def error_kind(reason: str | None) -> str:
    """The exception type of a node's error report, without its message (which may quote the
    users' data): ``"RuntimeError"`` from a SuperNode's ``"<class 'RuntimeError'>:<'...'>"``,
    ``"ValueError"`` from a traceback's ``"...\nValueError: shapes (3, 7) ..."``."""
    text = (reason or "").strip()
    flower = re.match(r"<class '([\w.]+)'>", text)  # how Flower reports an exception of a ClientApp
    if flower:
        return flower.group(1).rsplit(".", 1)[-1]
    last = text.splitlines()[-1:] or [""]
    kind = last[0].split(":", 1)[0].strip()
    return kind if kind.replace(".", "").replace("_", "").isalnum() else "an error"


class CohortStrategy:
    """Maps the sampled users of a round onto the available nodes and back (transport only)."""

    def __init__(self) -> None:
        self.sent: dict[int, list[int]] = {}  # node -> users of the current round

    def configure_train(self, round_idx: int, cohort: np.ndarray, params: torch.Tensor,
                        node_ids: Sequence[int]) -> list[Message]:
        """One ``train`` message per node carrying its share of the cohort (possibly none)."""
        self.sent = assign_users(cohort, node_ids)
        arrays = ArrayRecord({"params": encode(params)})  # encoded once, shared by all messages
        return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"round": round_idx, "users": users})}),
                        dst_node_id=node, message_type=TRAIN, group_id=str(round_idx))
                for node, users in self.sent.items()]

    def aggregate_train(self, replies: Iterable[Message]) -> list[ClientUpdate]:
        """One ``ClientUpdate`` per user of each replying node (``delta=None`` where malformed)."""
        updates = []
        for reply in replies:
            users = self.sent.pop(int(reply.metadata.src_node_id), None)
            if users is None:
                continue  # an unknown or duplicate sender
            if reply.has_error():  # its users count as dropped (no count in the log: it depends on the cohort)
                log.warning("node %s failed its users (%s; its own log has the details)", reply.metadata.src_node_id,
                            error_kind(reply.error.reason))
                continue
            content = reply.content
            refused = refusal(content)
            if refused is not None:  # the model itself is refused: no other node can train it either
                raise ConfigError(f"a client refused the model ({refused}): per-sample clipping (Book-Keeping) "
                                  "cannot clip it, e.g. its forward mixes samples; the node's log has the details")
            deltas = content.array_records.get("deltas")
            for user in users:
                delta = None
                try:
                    delta = decode(deltas[str(user)]) if deltas is not None else None
                except (KeyError, TypeError, ValueError):
                    pass
                metrics = content.metric_records.get(f"metrics.{user}")
                updates.append(ClientUpdate(user=user, delta=delta, metrics=dict(metrics) if metrics else {}))
        return updates
