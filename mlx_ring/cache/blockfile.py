"""One prompt-cache block's file, as bytes: what `disk.DiskTier` writes and verifies.

    magic (8 bytes) | header length (u32, little-endian) | blake2b-128 of the header | header |
    payload

The header is JSON: the file's format, the block's full key (hex), the scope it was written for,
each array's name, dtype, shape, byte offset and length within the payload, the payload's length
and its blake2b-128 checksum. Nothing is trusted before it is checked: a torn write, a file renamed
onto another key's name, a flipped byte and a file from another scope or format all fail `decode`
with `Corrupt`. No MLX: the engine thread turns arrays into records and back.
"""

import hashlib
import json
import struct
from dataclasses import dataclass

FORMAT = 1  # bump when the file layout changes: older files are then deleted at start
MAGIC = b"MLXRKV\x00\x00"
PREFIX = struct.Struct("<8sI16s")  # magic, header length, header digest
MAX_HEADER = 1 << 20  # a header is a few hundred bytes per array; a larger length is garbage


@dataclass(frozen=True)
class Record:
    """One block's arrays for this rank: name -> (dtype name, shape, raw), raw as bytes or a
    read-only byte view (cache/held.py's `to_record`)."""

    arrays: dict[str, tuple[str, tuple[int, ...], bytes | memoryview]]

    def nbytes(self) -> int:
        return sum(memoryview(raw).nbytes for _, _, raw in self.arrays.values())


class Corrupt(ValueError):
    """A block file that must not load; its message says what failed."""


def _digest(data) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def encode(key: bytes, scope: str, record: Record) -> list[bytes | memoryview]:
    """The file's pieces, in order (written one after another, so the payload is never copied)."""
    arrays, offset, payload = [], 0, hashlib.blake2b(digest_size=16)
    for name, (dtype, shape, raw) in record.arrays.items():
        view = memoryview(raw).cast("B")
        arrays.append([name, dtype, [int(n) for n in shape], offset, view.nbytes])
        payload.update(view)
        offset += view.nbytes
    header = json.dumps(
        {
            "format": FORMAT,
            "key": key.hex(),
            "scope": scope,
            "arrays": arrays,
            "payload": offset,
            "checksum": payload.hexdigest(),
        },
        separators=(",", ":"),
    ).encode()
    pieces = [PREFIX.pack(MAGIC, len(header), _digest(header)), header]
    return pieces + [memoryview(raw).cast("B") for _, _, raw in record.arrays.values()]


def decode(data: bytes, key: bytes, scope: str) -> Record:
    """The record in a whole file's bytes, once every field agrees with `key` and `scope` and the
    checksums match; Corrupt otherwise."""
    if len(data) < PREFIX.size:
        raise Corrupt(f"{len(data)} bytes, shorter than the file's prefix")
    magic, length, digest = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise Corrupt("not a block file (wrong magic)")
    if length > min(MAX_HEADER, len(data) - PREFIX.size):
        raise Corrupt(f"header of {length} bytes does not fit the file (truncated?)")
    raw = data[PREFIX.size : PREFIX.size + length]
    if _digest(raw) != digest:
        raise Corrupt("header checksum differs")
    try:
        header = json.loads(raw)
        fields = (header["format"], header["key"], header["scope"], header["payload"])
        arrays, checksum = header["arrays"], header["checksum"]
    except (ValueError, KeyError, TypeError) as e:
        raise Corrupt(f"unreadable header ({e})") from None
    if fields[:3] != (FORMAT, key.hex(), scope):
        raise Corrupt(f"header is for format {fields[0]}, key {fields[1]}, scope {fields[2]}")
    payload = memoryview(data)[PREFIX.size + length :]
    if payload.nbytes != fields[3]:
        raise Corrupt(f"payload of {payload.nbytes} bytes, header says {fields[3]} (truncated?)")
    if hashlib.blake2b(payload, digest_size=16).hexdigest() != checksum:
        raise Corrupt("payload checksum differs")
    return Record(_arrays(arrays, payload))


def _arrays(arrays, payload: memoryview) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    out, offset = {}, 0
    for entry in arrays:
        try:
            name, dtype, shape, start, length = entry
            fits = start == offset and length >= 0 and all(n >= 0 for n in shape)
        except (ValueError, TypeError) as e:
            raise Corrupt(f"unreadable array entry {entry!r} ({e})") from None
        if not fits:
            raise Corrupt(f"array {name!r} at {start}+{length} breaks the payload's layout")
        out[name] = (dtype, tuple(shape), bytes(payload[start : start + length]))
        offset += length
    if offset != payload.nbytes:
        raise Corrupt(f"arrays cover {offset} of the payload's {payload.nbytes} bytes")
    return out
