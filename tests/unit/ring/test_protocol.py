"""What another rank sends is checked with errors, not asserts: `python -O` drops asserts, and a
step header that cannot be one must stop the ring, never be acted on."""

import subprocess
import sys

import mlx.core as mx
import pytest

from mlx_ring.ring.protocol import Header, Kind, ProtocolError

BAD = [  # kind, batch, offset, dtype, group, summed, ndim, dims
    [99, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # no such kind
    [int(Kind.DECODE), 0, 0, 0, 0, 0, 5, 1, 1, 1],  # five dimensions
    [int(Kind.DECODE), 0, 0, 77, 0, 0, 2, 1, 8, 0],  # no such dtype
    [int(Kind.DECODE), 0, 0, 0, 0, 0, 2, -1, 8, 0],  # a negative size
    [int(Kind.DECODE), 0, 0, 3, 0, 2, 2, 1, 1, 0],  # summed is a flag
]


def test_a_header_no_rank_sends_is_refused():
    assert Header.parse(
        Header(Kind.PREFILL, batch=1, offset=8, shape=(1, 8, 16), dtype=2).ints()
    ) == Header(
        Kind.PREFILL, batch=1, offset=8, shape=(1, 8, 16), dtype=2
    )  # the fields the control link carries
    good = Header.for_payload(Kind.DECODE, mx.zeros((2, 1, 8)), group=1)
    assert Header.decode(good.encode()) == good and good.carried
    # ids that come in an all_sum
    summed = Header(Kind.DECODE, shape=(4, 1), dtype=3, group=1, summed=1)
    assert Header.decode(summed.encode()) == summed and not summed.carried
    for row in BAD:
        with pytest.raises(ProtocolError, match="a step header that no rank sends"):
            Header.decode(mx.array(row, dtype=mx.int32))


def test_the_checks_hold_under_python_O():
    code = (
        "import mlx.core as mx\nfrom mlx_ring.ring.protocol import Header, ProtocolError\nfor row "
        f"in {BAD!r}:\n    try:\n        Header.decode(mx.array(row, dtype=mx.int32))\n    except "
        f"ProtocolError:\n        continue\n    raise SystemExit(f'accepted {{row}}')\n"
    )
    r = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
