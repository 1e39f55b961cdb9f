"""Writing files in TFF's StackOverflow schema: ``tf.train.Example`` protos in a sqlite table
``examples(split_name, client_id, serialized_example_proto)`` — the inverse of the reader in
:mod:`fedpriv.data.stackoverflow`. The tests' fixtures and ``scripts/bench_scale.py`` generate
their files with it (nothing here downloads data)."""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fedpriv.data.stackoverflow import _FIXED32, _LEN, _UINT64, _VARINT

_INT64_MIN = -(2**63)



def _varint(value: int) -> bytes:
    """Encodes a non-negative integer as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, _LEN) + _varint(len(payload)) + payload


def _encode_int64s(values: Sequence[int], packed: bool) -> bytes:
    for v in values:
        if not _INT64_MIN <= v < 2**63:
            raise ValueError(f"{v} does not fit in int64")
    varints = [_varint(v % _UINT64) for v in values]
    if packed:
        return _len_field(1, b"".join(varints)) if varints else b""
    return b"".join(_tag(1, _VARINT) + v for v in varints)


def _encode_floats(values: Sequence[float], packed: bool) -> bytes:
    if packed:
        return _len_field(1, struct.pack(f"<{len(values)}f", *values)) if values else b""
    return b"".join(_tag(1, _FIXED32) + struct.pack("<f", v) for v in values)


def _encode_feature(values: Sequence[bytes] | Sequence[int] | Sequence[float], packed: bool) -> bytes:
    """Picks the list kind from the values: all bytes, all ints, or numbers with a float."""
    if all(isinstance(v, bytes) for v in values):  # also the empty list
        return _len_field(1, b"".join(_len_field(1, v) for v in values))
    if all(isinstance(v, int) for v in values):
        return _len_field(3, _encode_int64s(values, packed))
    if all(isinstance(v, (int, float)) for v in values):
        return _len_field(2, _encode_floats(values, packed))
    raise TypeError("feature values must be all bytes, all ints or all numbers")


def encode_example(
    features: Mapping[str, Sequence[bytes] | Sequence[int] | Sequence[float]], *, packed: bool = True
) -> bytes:
    """Serializes ``{name: values}`` as a ``tf.train.Example`` (the inverse of
    :func:`fedpriv.data.stackoverflow.decode_example`).

    Lists of bytes become ``bytes_list``, of ints ``int64_list``, of numbers with a float
    ``float_list`` (stored as float32), an empty list an empty ``bytes_list``. ``packed=True`` writes
    int64/float lists packed, as TensorFlow does; ``packed=False`` writes one field per value.
    """
    entries = b"".join(
        _len_field(1, _len_field(1, name.encode("utf-8")) + _len_field(2, _encode_feature(v, packed)))
        for name, v in features.items()
    )
    return _len_field(1, entries)


def write_examples(path: Path, rows: Iterable[tuple[str, str, str]], *, metadata: bool = False,
                   index: bool = False) -> Path:
    """A sqlite file with TFF's schema from ``(split, client_id, tokens)`` rows; each example carries
    TFF's other features too (fixed placeholder values). ``metadata``: also the
    ``client_metadata`` table; ``index``: an index on (client_id, split_name)."""
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,"
                    " serialized_example_proto BLOB NOT NULL)")
        con.executemany("INSERT INTO examples VALUES (?, ?, ?)", (
            (split, client, encode_example({"creation_date": [b"2017-01-01 00:00:00+00:00"], "title": [b"how to sort"],
                                            "score": [n - 3], "tags": [b"python|list"], "tokens": [tokens.encode()],
                                            "type": [b"question"]}))
            for n, (split, client, tokens) in enumerate(rows)))
        if metadata:
            con.execute("CREATE TABLE client_metadata (client_id TEXT, split_name TEXT, num_examples INTEGER)")
            con.execute("INSERT INTO client_metadata SELECT client_id, split_name, COUNT(*) FROM examples"
                        " GROUP BY client_id, split_name")
        if index:
            con.execute("CREATE INDEX examples_client ON examples (client_id, split_name)")
        con.commit()
    finally:
        con.close()
    return path
