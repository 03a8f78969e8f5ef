"""ring_driver.py with each rank's Ring framed as the server frames it (RING_FRAMES from the
environment, here forced on a TCP ring), noting the size of every message it sends and receives:
`frames{rank}.json` in the first `--out` folder lists them."""

import argparse
import json
from pathlib import Path

import mlx.core as mx
import ring_driver

from mlx_ring.ring.frames import framed
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.world import world_backend

SIZES: dict[str, set[int]] = {"sent": set(), "received": set()}
_send, _recv = mx.distributed.send, mx.distributed.recv


def noting_send(x, dst, *args, **kw):
    SIZES["sent"].add(x.nbytes)
    return _send(x, dst, *args, **kw)


def noting_recv(shape, dtype, src, *args, **kw):
    out = _recv(shape, dtype, src, *args, **kw)
    SIZES["received"].add(out.nbytes)
    return out


class FramedRing(Ring):
    made: list["FramedRing"] = []

    def __init__(self, world):
        super().__init__(world, frame=framed(world_backend() == "jaccl"))
        FramedRing.made.append(self)


def main():
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--out", nargs="+", required=True)
    out = Path(p.parse_known_args()[0].out[0])
    mx.distributed.send, mx.distributed.recv = noting_send, noting_recv
    ring_driver.Ring = FramedRing
    ring_driver.main()
    for ring in FramedRing.made:
        (out / f"frames{ring.rank}.json").write_text(
            json.dumps({"frame": ring.frame, **{k: sorted(v) for k, v in SIZES.items()}})
        )


if __name__ == "__main__":
    main()
