"""What a verify pass costs: one step of a decode group with L = 1 + k positions per row (the row's
token and k drafts) through the real ring, for k = 0..8, then the TRIM step that drops them again,
so the cache stays at the prompt's length. Run under mlx.launch like the server:

    python tools/fed.py mlx.launch --backend ring --hostfile hosts.json -- \\
        python tools/bench_verify.py --model DIR --rows 1,16
    (add CUDA_PER_RANK=1 to the environment on a multi-GPU host)

Prints one JSON line per (rows, k): milliseconds per verify step and per trim step (medians).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
from ring_join import join_ring  # noqa: E402

from mlx_ring.ring.pipeline import Pipeline  # noqa: E402
from mlx_ring.ring.protocol import Header, Kind  # noqa: E402


def timed(pipe: Pipeline, header: Header, payload: mx.array) -> float:
    t0 = time.perf_counter()
    out = pipe.round_trip(header, payload)
    pipe.settle()
    if out is not None:
        mx.eval(out)
    return (time.perf_counter() - t0) * 1e3


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--rows", default="1,16")
    p.add_argument("--drafts", default="0,1,2,3,4,5,6,7,8")
    p.add_argument("--context", type=int, default=512, help="tokens in each row's cache")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    pipe = join_ring(a.model)
    if pipe is None:
        return
    shard, ranks = pipe.stage, pipe.ring.size
    for group, rows in enumerate(int(x) for x in a.rows.split(",")):
        # (rows, context, H)
        prompt = shard.embed(mx.arange(rows * a.context).reshape(rows, a.context) % 1000 + 100)
        pipe.round_trip(Header.for_payload(Kind.PREFILL, prompt, batch=group), prompt)
        padding = mx.zeros((rows,), dtype=mx.int32)
        pipe.round_trip(Header.for_payload(Kind.JOIN, padding, batch=group, group=group), padding)
        for k in (int(x) for x in a.drafts.split(",")):
            h = shard.embed(mx.full((rows, 1 + k), 7))  # (rows, 1 + k, H)
            drop = mx.full((rows,), k, dtype=mx.int32)
            verify, trim = [], []
            for i in range(a.repeats + 3):  # the first steps of a new shape compile kernels
                v = timed(pipe, Header.for_payload(Kind.DECODE, h, group=group), h)
                t = (
                    timed(pipe, Header.for_payload(Kind.TRIM, drop, group=group), drop)
                    if k
                    else 0.0
                )
                if i >= 3:
                    verify.append(v)
                    trim.append(t)
            print(
                json.dumps(
                    {
                        "ranks": ranks,
                        "rows": rows,
                        "drafts": k,
                        "verify_ms": round(statistics.median(verify), 3),
                        "trim_ms": round(statistics.median(trim), 3),
                    }
                ),
                flush=True,
            )
        pipe.round_trip(Header(Kind.FILTER, group=group))
    pipe.shutdown()


if __name__ == "__main__":
    main()
