"""Wire format of flat float32 vectors in Flower messages (raw little-endian bytes) and of a
node's reply: the message format the server (``server/strategy.py``) and the clients
(``client/app.py``) share; neither imports the other.

Flower's default ``Array(ndarray)`` runs ``np.save`` (~17 ms for a 4M-parameter model here);
raw bytes cost one memcpy to encode and none to decode.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedpriv.round.replies import ClientUpdate

STYPE = "fedpriv.raw"


def encode(vector: torch.Tensor) -> Array:
    host = vector.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    data = host.astype("<f4", copy=False).tobytes()
    return Array(dtype="float32", shape=(int(vector.numel()),), stype=STYPE, data=data)


def decode(array: Array) -> torch.Tensor:
    """A read-only-backed float32 tensor viewing ``array``'s bytes; raises ``ValueError`` if malformed."""
    if array.stype != STYPE or array.dtype != "float32" or len(array.shape) != 1:
        raise ValueError(f"unexpected array encoding {array.stype}/{array.dtype}/{array.shape}")
    if len(array.data) != 4 * array.shape[0]:
        raise ValueError(f"array holds {len(array.data)} bytes for {array.shape[0]} float32 values")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # non-writable buffer: never written in place
        return torch.frombuffer(array.data, dtype=torch.float32)


REFUSED = "refused"  # a node's reply that its per-sample clipping engine refused the model


def refusal_content(kind: str, where: str) -> RecordDict:
    """A node's reply that it refused the model (``kind``: the error's type; ``where``: the layer,
    as ``path (Type)``, or empty): the model's structure only, never the users' data."""
    return RecordDict({REFUSED: ConfigRecord({"kind": kind, "where": where})})


def refusal(content: RecordDict) -> str | None:
    """What a reply's :func:`refusal_content` says, as one phrase, or None for any other reply."""
    record = content.config_records.get(REFUSED)
    if record is None:
        return None
    kind, where = str(record.get("kind", "")), str(record.get("where", ""))
    return f"{kind or 'a refusal'}{f' at {where}' if where else ''}"


def train_reply_content(updates: Iterable[ClientUpdate]) -> RecordDict:
    """A node's reply: every user's delta, and its metrics only where there are any (research-mode
    diagnostics of user-level runs; none otherwise)."""
    updates = list(updates)
    content = RecordDict({"deltas": ArrayRecord({str(u.user): encode(u.delta) for u in updates})})
    for u in updates:
        if u.metrics:
            content[f"metrics.{u.user}"] = MetricRecord(dict(u.metrics))
    return content
