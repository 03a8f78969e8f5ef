"""sep-*: the CPU op evaluated apart from the stage (its own eval before or after). One process, one GPU: does a CPU-stream op next to a stage (as the ring's recv before it and send
after it are) cost a decode step time? Rank 1's half of the 8B, median of 25 steps, blocking eval."""
import time
from pathlib import Path
import mlx.core as mx
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.protocol import Header, Kind
from shard import load_shard
M = Path("/tmp/llama8b")
sh = load_shard(M, uniform_plan(spec_from_folder(M).n_layers, 2), 1)
def med(ts): ts = sorted(ts); return ts[len(ts)//2] * 1e3
for B in (1, 16, 64):
    h = mx.random.normal((B, 25, 4096)).astype(mx.bfloat16)
    mx.eval(sh.apply(Header.for_payload(Kind.PREFILL, h, batch=B), h))
    pad = mx.zeros((B,), dtype=mx.int32)
    sh.apply(Header.for_payload(Kind.JOIN, pad, batch=B, group=B), pad)
    x0 = mx.random.normal((B, 1, 4096)).astype(mx.bfloat16); mx.eval(x0)
    for mode in ("gpu", "cpu-in-out", "sep-in-out", "sep-in", "sep-out", "gpu", "cpu-in-out", "sep-in-out"):
        ts, x = [], x0
        for i in range(30):
            t0 = time.perf_counter()
            inp = mx.multiply(x, 1, stream=mx.cpu) if "in" in mode.split("-") else x
            if mode.startswith("sep") and "in" in mode.split("-"):
                mx.eval(inp)  # the crossing evaluated on its own: no cross-stream event in the stage's graph
            out = sh.apply(Header.for_payload(Kind.DECODE, inp, group=B), inp)
            if mode.startswith("sep") and mode.endswith("out"):
                mx.eval(out)
            res = mx.multiply(out, 1, stream=mx.cpu) if mode.endswith("out") else out
            mx.eval(res)
            ts.append(time.perf_counter() - t0)
            x = res if mode.endswith("out") else out
            for c in sh.groups[B]:
                c.trim(1)
        print(f"rows {B} {mode}: {med(ts[5:]):.2f} ms", flush=True)
