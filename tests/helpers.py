"""Helpers only the tests use (moved out of fedpriv/, which keeps only what it runs): brute-force
oracles of the sensitivity programs, a ``tf.train.Example`` writer for fake StackOverflow files,
and small views of generated data."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping, Sequence

import dp_accounting
import numpy as np
import torch

from fedpriv.accounting.tree import tree_accounting
from fedpriv.data.federated import FederatedDataset
from fedpriv.data.stackoverflow import _FIXED32, _LEN, _UINT64, _VARINT

_INT64_MIN = -(2**63)


# ------------------------------------------------------------------ tree aggregation (fedpriv.accounting.tree)

def brute_force_sensitivity_sq(participations: int, separation: int, rounds: int) -> int:
    """The same worst case by enumerating placements (small cases; for tests)."""
    nodes = [(s, s + 2 ** h) for h in range(rounds.bit_length()) for s in range(0, rounds, 2 ** h)
             if s + 2 ** h <= rounds]
    best = 0
    for places in itertools.combinations(range(rounds), participations):
        if any(b - a - 1 < separation for a, b in zip(places, places[1:])):
            continue
        total = sum(sum(lo <= p < hi for p in places) ** 2 for lo, hi in nodes)
        best = max(best, total)
    return best


def tree_event(noise_multiplier: float, rounds: int, participations: int, separation: int,
               restart_every: int | None = None, planned_rounds: int | None = None,
               planned_participations: int | None = None) -> dp_accounting.DpEvent:
    """The event of :func:`tree_accounting`."""
    return tree_accounting(noise_multiplier, rounds, participations, separation, restart_every, planned_rounds,
                           planned_participations)[0]


# ------------------------------------------------------------------ BandMF (fedpriv.mechanisms.bandmf)

def sensitivity_sq_brute_force(c: torch.Tensor, participations: int, min_gap: int) -> float:
    """``max_π Σ_{i,j∈π} |(CᵀC)_{ij}|`` over participation sets π of size k whose indices differ
    by at least ``min_gap`` (worst case over the users' unit-norm contributions)."""
    gram = (c.T @ c).abs()
    n = c.shape[0]
    best = 0.0
    for pattern in itertools.combinations(range(n), participations):
        if any(b - a < min_gap for a, b in zip(pattern, pattern[1:])):
            continue
        idx = torch.tensor(pattern)
        best = max(best, float(gram[idx][:, idx].sum()))
    return best


# ------------------------------------------------------------------ tf.train.Example writer (fake sqlite files)

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


# ------------------------------------------------------------------ generated data


def user_sizes(ds: FederatedDataset) -> np.ndarray:
    """Sentences per training user."""
    return np.array([len(u) for u in ds.users], dtype=np.int64)


# ------------------------------------------------------------------ interrupted runs

class Killed(RuntimeError):
    """Raised in place of a round to stand for the process being killed."""


def interrupt_and_resume(cfg: dict, crash_round: int):
    """Run ``cfg`` in process until it is "killed" during round ``crash_round`` (0-based, after
    the previous round's checkpoint), then prepare its resume; returns ``(first, resumed)``."""
    import pytest

    from client.app import make_client_app
    from fedpriv.runner import prepare, train
    from server.app import grid_round_fn
    from server.grid import LocalGrid

    first = prepare(cfg)
    inner = grid_round_fn(first, LocalGrid(make_client_app(cfg)), 1, None)

    def crashing(round_idx, cohort):
        if round_idx == crash_round:
            raise Killed
        return inner(round_idx, cohort)

    with pytest.raises(Killed):
        train(first, crashing)
    return first, prepare({**cfg, "resume": True})
