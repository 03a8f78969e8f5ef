"""A step as fixed-size frames, for JACCL: every message between two ranks is then the same size.

JACCL's point-to-point sends of changing shapes can deliver wrong data or hang
(ml-explore/mlx#3149), and Apple's RDMA over Thunderbolt requires a receive to be posted for exactly
as many 4 KiB frames as the message it takes (TN3205). The step protocol's header and payload differ
in size from message to message; framed, a step is the header's bytes, then the payload's, then
zeros, cut into frames of FRAME_BYTES, each sent alone. The first frame tells the rest's count, so a
receiver never posts a receive of another size. A decode step of up to about 16k hidden values fits
one frame with its header: one message a hop instead of two.
"""

import math

import mlx.core as mx

from mlx_ring import settings
from mlx_ring.ring.protocol import DTYPES, HEADER_LEN, Header

# 64 KiB: one of JACCL's own buffer sizes (4 KiB times a power of two up to 512 KiB, chosen per
# message from its size, mlx/distributed/jaccl/utils.h), so each frame is exactly one RDMA send and
# one receive, all of one size; a decode step fits one, a prompt chunk spans several.
FRAME_BYTES = 1 << 16
HEADER_BYTES = HEADER_LEN * 4  # int32s


def framed(jaccl: bool, value: str | None = None) -> int:
    """The frame size a ring uses (0: none): RING_FRAMES (`value`, else the
    environment) auto (framed on JACCL only), on, off, or a frame size in bytes (tests
    make steps span several frames)."""
    value = value if value is not None else settings.text("RING_FRAMES")
    if value.isdigit() and int(value) >= 2 * HEADER_BYTES:
        return int(value)
    if value not in ("auto", "on", "off"):
        raise ValueError(
            f"RING_FRAMES={value!r}: use auto (framed on JACCL), on, off, or a frame size of at "
            f"least {2 * HEADER_BYTES} bytes"
        )
    return FRAME_BYTES if value == "on" or (value == "auto" and jaccl) else 0


def payload_bytes(header: Header) -> int:
    return math.prod(header.shape) * DTYPES[header.dtype].size if header.carried else 0


def frame_count(header: Header, frame: int) -> int:
    """How many frames carry `header`'s step (its header and payload)."""
    return max(1, -(-(HEADER_BYTES + payload_bytes(header)) // frame))


def pack(header: Header, payload: mx.array | None, frame: int) -> mx.array:
    """`header` (its shape and dtype already `payload`'s) and `payload` as
    (n, frame) bytes, lazily."""
    parts = [mx.view(header.encode(), mx.uint8)]
    if payload is not None and payload.ndim:
        parts.append(mx.view(payload, mx.uint8).reshape(-1))
    n = frame_count(header, frame)
    parts.append(mx.zeros((n * frame - HEADER_BYTES - payload_bytes(header),), dtype=mx.uint8))
    return mx.concatenate(parts).reshape(n, frame)


def header_of(first: mx.array) -> Header:
    """The header a step's first frame starts with (ProtocolError if it cannot be one)."""
    return Header.decode(mx.view(first[:HEADER_BYTES], mx.int32))


def payload_of(header: Header, frames: list[mx.array]) -> mx.array:
    """The payload `frames` (a step's, the first included) carry, in `header`'s shape and dtype."""
    data = mx.concatenate(frames)[HEADER_BYTES : HEADER_BYTES + payload_bytes(header)]
    return mx.view(data, DTYPES[header.dtype]).reshape(header.shape)
