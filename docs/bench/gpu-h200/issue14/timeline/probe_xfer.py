"""One process, one GPU: what a ring payload's trip through host memory costs a decode step of the
second half of the 8B (rank 1 of 2). in=gpu|host: the step's input made on the GPU or from host bytes
(as a recv makes it); out=keep|read: the output left on the GPU or read on the host (as a send reads it)."""
import time
from pathlib import Path
import numpy as np
import mlx.core as mx
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.protocol import Header, Kind
from shard import load_shard
M = Path("/tmp/llama8b")
sh = load_shard(M, uniform_plan(spec_from_folder(M).n_layers, 2), 1)
for B in (1, 16, 64):
    h = mx.random.normal((B, 25, 4096)).astype(mx.bfloat16)
    mx.eval(sh.apply(Header.for_payload(Kind.PREFILL, h, batch=B), h))
    pad = mx.zeros((B,), dtype=mx.int32)
    sh.apply(Header.for_payload(Kind.JOIN, pad, batch=B, group=B), pad)
    host = np.random.randn(B, 1, 4096).astype(np.float32)
    for src in ("gpu", "host", "host-copied"):
        for dst in ("keep", "read"):
            ts = []
            for i in range(30):
                t0 = time.perf_counter()
                if src == "gpu":
                    x = mx.random.normal((B, 1, 4096)).astype(mx.bfloat16)
                else:
                    x = mx.array(host).astype(mx.bfloat16)  # bytes from the host, as a recv leaves them
                    if src == "host-copied":
                        x = mx.contiguous(x * 1)
                out = sh.apply(Header.for_payload(Kind.DECODE, x, group=B), x)
                mx.eval(out)
                if dst == "read":
                    np.array(out.astype(mx.float32), copy=False)
                ts.append(time.perf_counter() - t0)
                for c in sh.groups[B]:
                    c.trim(1)
            ts = sorted(ts[5:])
            print(f"rows {B} in {src} out {dst}: {ts[len(ts)//2]*1e3:.2f} ms", flush=True)
