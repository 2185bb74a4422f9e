"""The protocol buffers wire format, as much of it as Chakra's traces use: varints, 64-bit numbers,
length-delimited fields, and a stream of length-prefixed messages.

Facts from https://protobuf.dev/programming-guides/encoding/: a field is a key varint
`(field_number << 3) | wire_type` then its value; wire type 0 is a varint (int32/int64/uint64/bool/enum;
a negative int64 takes ten bytes as its two's complement), 1 is eight little-endian bytes (double,
fixed64), 2 is a varint length then that many bytes (string, bytes, a sub-message, a packed repeated
scalar), 5 is four little-endian bytes (float, fixed32). A stream of messages as Chakra writes them
(`encode_message` in chakra's src/third_party/utils/protolib.py) puts each message's length as a varint
before it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
MASK64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not the protocol buffers wire format."""


def varint(value: int) -> bytes:
    """A non-negative integer, or a negative one as its 64-bit two's complement (as int64 is written)."""
    value &= MASK64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); at most ten bytes."""
    value = shift = 0
    for i in range(10):
        if pos + i >= len(data):
            raise WireError(f"a varint runs past the end at byte {pos}")
        byte = data[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & MASK64, pos + i + 1
        shift += 7
    raise WireError(f"a varint longer than ten bytes at byte {pos}")


def signed64(value: int) -> int:
    """A varint read back as int64."""
    return value - (1 << 64) if value >> 63 else value


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def uint_field(field: int, value: int) -> bytes:
    """A varint field (uint64, int64, int32, bool, enum); proto3 leaves zero out."""
    return key(field, VARINT) + varint(int(value)) if value else b""


def bytes_field(field: int, value: bytes) -> bytes:
    return key(field, LENGTH) + varint(len(value)) + value


def string_field(field: int, value: str) -> bytes:
    return bytes_field(field, value.encode("utf-8")) if value else b""


def double_field(field: int, value: float) -> bytes:
    return key(field, FIXED64) + struct.pack("<d", value)


def packed_uints(field: int, values: list[int]) -> bytes:
    """A repeated integer field, packed (proto3's default)."""
    return bytes_field(field, b"".join(varint(v) for v in values)) if values else b""


def fields(data: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field of one message: an int for varints, bytes for
    length-delimited fields, the raw eight or four bytes for fixed ones."""
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire_type == VARINT:
            value, pos = read_varint(data, pos)
            yield number, wire_type, value
        elif wire_type == LENGTH:
            size, pos = read_varint(data, pos)
            if pos + size > len(data):
                raise WireError(f"field {number} of {size} bytes runs past the end of its message")
            yield number, wire_type, data[pos:pos + size]
            pos += size
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
            if pos + size > len(data):
                raise WireError(f"field {number} runs past the end of its message")
            yield number, wire_type, data[pos:pos + size]
            pos += size
        else:
            raise WireError(f"field {number} has wire type {wire_type}, which proto3 messages do not use")


def unpack_uints(value: object, wire_type: int) -> list[int]:
    """A repeated integer field's values, packed or not."""
    if wire_type == VARINT:
        return [int(value)]  # type: ignore[arg-type]
    data, pos, out = bytes(value), 0, []  # type: ignore[arg-type]
    while pos < len(data):
        v, pos = read_varint(data, pos)
        out.append(v)
    return out


def write_delimited(stream: BinaryIO, message: bytes) -> None:
    stream.write(varint(len(message)) + message)


def read_delimited(data: bytes) -> Iterator[bytes]:
    """The messages of a length-prefixed stream."""
    pos = 0
    while pos < len(data):
        size, pos = read_varint(data, pos)
        if pos + size > len(data):
            raise WireError(f"a message of {size} bytes at byte {pos} runs past the end of the file")
        yield data[pos:pos + size]
        pos += size
