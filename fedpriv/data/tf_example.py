"""The ``tf.train.Example`` protobuf wire format, without TensorFlow or protobuf: one decoder
(:func:`decode_example`, for the StackOverflow loader :mod:`fedpriv.data.stackoverflow`) and its
inverse (:func:`encode_example`, for :mod:`fedpriv.data.stackoverflow_writer`).

Only what an Example holds is handled: varint, fixed32/fixed64 and length-delimited fields
(wire types 0, 1, 2, 5; groups are refused), int64 as two's complement, float as little-endian
float32. The message layout is in :func:`decode_example`'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
import struct

FeatureValues = list[bytes] | list[int] | list[float]

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_UINT64 = 2**64
_INT64_MIN = -(2**63)

# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decodes the unsigned varint at ``buf[pos:]``; returns (value, next position)."""
    value = shift = 0
    while shift < 70:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Yields (field number, wire type, value) of a message: an int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
        else:
            if wire == _LEN:
                size, pos = _read_varint(buf, pos)
            elif wire in (_FIXED32, _FIXED64):
                size = 4 if wire == _FIXED32 else 8
            else:
                raise ValueError(f"unsupported protobuf wire type {wire}")
            if pos + size > len(buf):
                raise ValueError("truncated protobuf field")
            value, pos = buf[pos : pos + size], pos + size
        yield number, wire, value


def _as_int64(value: int) -> int:
    """Reads an unsigned 64-bit varint value as two's-complement int64."""
    return value - _UINT64 if value >= 2**63 else value


def _decode_int64s(buf: bytes) -> list[int]:
    """Int64List: field 1, packed (one LEN of varints) or unpacked (one varint per value)."""
    out: list[int] = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if wire == _VARINT:
            out.append(_as_int64(value))
        elif wire == _LEN:
            pos = 0
            while pos < len(value):
                raw, pos = _read_varint(value, pos)
                out.append(_as_int64(raw))
        else:
            raise ValueError(f"Int64List value with wire type {wire}")
    return out


def _decode_floats(buf: bytes) -> list[float]:
    """FloatList: field 1, little-endian float32s, packed (one LEN) or unpacked (one fixed32 each)."""
    out: list[float] = []
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        if wire not in (_FIXED32, _LEN) or len(value) % 4:
            raise ValueError("malformed FloatList")
        out.extend(struct.unpack(f"<{len(value) // 4}f", value))
    return out


def _decode_bytes(buf: bytes) -> list[bytes]:
    """BytesList: field 1, one LEN per value."""
    return [value for number, wire, value in _fields(buf) if number == 1 and wire == _LEN]


_LIST_DECODERS = {1: _decode_bytes, 2: _decode_floats, 3: _decode_int64s}


def _decode_feature(buf: bytes) -> FeatureValues:
    """Feature: a oneof of the three lists; an empty Feature decodes to ``[]``."""
    values: FeatureValues = []
    for number, _, value in _fields(buf):
        if number in _LIST_DECODERS:
            values = _LIST_DECODERS[number](value)  # oneof: the last one set wins
    return values


def decode_example(blob: bytes) -> dict[str, FeatureValues]:
    """Decodes a serialized ``tf.train.Example`` into ``{feature name: values}``.

    Field numbers (tensorflow/core/example/{example,feature}.proto)::

        Example   { Features features = 1; }
        Features  { map<string, Feature> feature = 1; }  // entry { string key = 1; Feature value = 2; }
        Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                 Int64List int64_list = 3; } }
        BytesList { repeated bytes value = 1; }
        FloatList { repeated float value = 1 [packed = true]; }   // fixed32, little-endian
        Int64List { repeated int64 value = 1 [packed = true]; }   // varint; negatives take 10 bytes

    Packed and unpacked repeated scalars are both accepted, unknown fields are skipped, and a
    repeated map key keeps its last value (protobuf merge semantics).
    """
    features: dict[str, FeatureValues] = {}
    for number, _, payload in _fields(blob):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(payload):
            if entry_number != 1:
                continue
            key, value = b"", b""
            for field, _, content in _fields(entry):
                if field == 1:
                    key = content
                elif field == 2:
                    value = content
            features[key.decode("utf-8")] = _decode_feature(value)
    return features


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    """Encodes a non-negative integer as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    """The key of field ``number`` with wire type ``wire``."""
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: key, length, payload."""
    return _tag(number, _LEN) + _varint(len(payload)) + payload


def _encode_int64s(values: Sequence[int], packed: bool) -> bytes:
    """Int64List: two's-complement varints, packed into one LEN field or one field each."""
    for v in values:
        if not _INT64_MIN <= v < 2**63:
            raise ValueError(f"{v} does not fit in int64")
    varints = [_varint(v % _UINT64) for v in values]
    if packed:
        return _len_field(1, b"".join(varints)) if varints else b""
    return b"".join(_tag(1, _VARINT) + v for v in varints)


def _encode_floats(values: Sequence[float], packed: bool) -> bytes:
    """FloatList: little-endian float32s, packed into one LEN field or one fixed32 each."""
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
    :func:`decode_example`).

    Lists of bytes become ``bytes_list``, of ints ``int64_list``, of numbers with a float
    ``float_list`` (stored as float32), an empty list an empty ``bytes_list``. ``packed=True`` writes
    int64/float lists packed, as TensorFlow does; ``packed=False`` writes one field per value.
    """
    entries = b"".join(
        _len_field(1, _len_field(1, name.encode("utf-8")) + _len_field(2, _encode_feature(v, packed)))
        for name, v in features.items()
    )
    return _len_field(1, entries)
