"""DP-FedAvg as a Flower strategy: *configure* builds the round's messages, *aggregate* turns
the replies into ``ClientUpdate``s. All clipping, noise and accounting happen in
``fedpriv.dpfedavg.DPFedAvg``; a malformed reply becomes ``delta=None`` and is rejected there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from client.codec import decode, encode
from fedpriv.dpfedavg import ClientUpdate

TRAIN = "train"


class DPFedAvgStrategy:
    """Maps the sampled users of a round onto the available nodes and back."""

    def configure_train(self, round_idx: int, cohort: np.ndarray, params: torch.Tensor,
                        node_ids: Sequence[int]) -> list[Message]:
        """One ``train`` message per sampled user; user i of the cohort goes to node i mod |nodes|."""
        if not node_ids:
            raise RuntimeError("no nodes are connected")
        arrays = ArrayRecord({"params": encode(params)})  # encoded once, shared by all messages
        nodes = sorted(node_ids)
        return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"round": round_idx, "user": int(u)})}),
                        dst_node_id=nodes[i % len(nodes)], message_type=TRAIN, group_id=str(round_idx))
                for i, u in enumerate(cohort)]

    def aggregate_train(self, replies: Iterable[Message]) -> list[ClientUpdate]:
        """Unpack replies; an error reply is skipped (its user counts as dropped), a malformed one rejected."""
        updates = []
        for reply in replies:
            if reply.has_error():
                continue
            try:
                metrics = dict(reply.content["metrics"])
                user = int(metrics.pop("user"))
            except (KeyError, TypeError, ValueError):
                continue  # no user id: cannot be attributed, counts as dropped
            try:
                delta = decode(reply.content["delta"]["delta"])
            except (KeyError, TypeError, ValueError):
                delta = None
            updates.append(ClientUpdate(user=user, delta=delta, metrics=metrics))
        return updates
