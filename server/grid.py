"""An in-process Flower ``Grid``: messages go straight into the ClientApp, no Ray, no sockets."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    """``num_nodes`` virtual nodes (ids 1..n) served by one ClientApp in this process, each with
    its own Context (``run_config``: Flower's run config; ``node_config(n)``: settings of node n
    beside its partition). A node's exception propagates, or with ``error_replies`` becomes the
    error reply a Flower SuperNode sends (and, as there, leaves the node's Context unchanged)."""

    def __init__(self, client_app: ClientApp, num_nodes: int = 1, run_id: int = 1,
                 run_config: Mapping[str, Any] | None = None,
                 node_config: Callable[[int], Mapping[str, Any]] | None = None, error_replies: bool = False) -> None:
        self._client_app = client_app
        self._error_replies = error_replies
        # Flower stamps messages with the identity of the task running in this process.
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
        self._run = Run.create_empty(run_id)
        self._contexts = {n: Context(run_id=run_id, node_id=n,
                                     node_config={"partition-id": n - 1, "num-partitions": num_nodes,
                                                  **(node_config(n) if node_config else {})},
                                     state=RecordDict(), run_config=dict(run_config or {}))
                          for n in range(1, num_nodes + 1)}
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg_id = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = msg_id
            # each node gets its own copy, as over a wire (a ClientApp's mod may edit the content it gets,
            # and a workflow may send one content object to several nodes)
            self._replies[msg_id] = self._answer(copy.deepcopy(msg), msg.metadata.dst_node_id)
            ids.append(msg_id)
        return ids

    def _answer(self, msg: Message, node: int) -> Message:
        if not self._error_replies:
            return self._client_app(msg, self._contexts[node])
        context = copy.deepcopy(self._contexts[node])
        try:
            out = self._client_app(msg, context)
        except Exception as err:  # what a SuperNode sends back (flwr.supernode.runtime.run_clientapp)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err)}:<'{err}'>"),
                           reply_to=msg)
        self._contexts[node] = context
        return out

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))
