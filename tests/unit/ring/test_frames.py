"""A step as fixed-size frames (ring/frames.py): header and payload come back bitwise for every
payload dtype, exactly filling frames or not, with no payload, and the setting's values."""

import mlx.core as mx
import pytest

from mlx_ring.ring.frames import (
    FRAME_BYTES,
    HEADER_BYTES,
    frame_count,
    framed,
    header_of,
    pack,
    payload_of,
)
from mlx_ring.ring.protocol import DTYPES, Header, Kind


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 8, 64), (1, 1, (256 - HEADER_BYTES) // 4)])
def test_a_step_comes_back_bitwise_from_its_frames(dtype, shape):
    payload = (mx.random.normal(shape) * 1000).astype(dtype)
    header = Header.for_payload(Kind.PREFILL, payload, batch=3, offset=17, group=2)
    frames = pack(header, payload, 256)
    n = frame_count(header, 256)
    assert frames.shape == (n, 256) and n == -(-(HEADER_BYTES + payload.nbytes) // 256)
    back = header_of(frames[0])
    assert back == header
    got = payload_of(back, [frames[i] for i in range(n)])
    assert got.dtype == dtype and got.shape == shape
    # bitwise, NaN or not
    assert mx.array_equal(mx.view(got, mx.uint8), mx.view(payload, mx.uint8)).item()


def test_a_step_without_payload_is_one_frame():
    frames = pack(Header(Kind.PING), None, 256)
    assert frames.shape == (1, 256) and header_of(frames[0]) == Header(Kind.PING)
    # ids in an all_sum
    summed = Header(Kind.DECODE, shape=(64, 1), dtype=DTYPES.index(mx.int32), group=1, summed=1)
    frames = pack(summed, None, 256)
    assert frames.shape == (1, 256) and header_of(frames[0]) == summed


def test_the_setting():
    assert framed(True, "auto") == FRAME_BYTES and framed(False, "auto") == 0
    assert (
        framed(False, "on") == FRAME_BYTES
        and framed(True, "off") == 0
        and framed(False, "4096") == 4096
    )
    with pytest.raises(ValueError, match="RING_FRAMES='8': use auto"):
        framed(True, "8")
