"""One process: a decode step of a 64/16/1-row group through the real Shard, whole model (rank 0 of 1)
and the second half (rank 1 of 2): graph build time and eval time, median of 20."""
import time, sys
from pathlib import Path
import mlx.core as mx
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.protocol import Header, Kind
from shard import load_shard
M = Path("/tmp/llama8b")
n = spec_from_folder(M).n_layers
def med(ts): ts = sorted(ts); return ts[len(ts)//2] * 1e3
for ranks, rank in ((1, 0), (2, 1), (2, 0)):
    sh = load_shard(M, uniform_plan(n, ranks), rank)
    for B in (1, 16, 64):
        h = mx.random.normal((B, 25, 4096)).astype(mx.bfloat16)
        mx.eval(sh.apply(Header.for_payload(Kind.PREFILL, h, batch=B), h))
        pad = mx.zeros((B,), dtype=mx.int32)
        sh.apply(Header.for_payload(Kind.JOIN, pad, batch=B, group=B), pad)
        x = mx.random.normal((B, 1, 4096)).astype(mx.bfloat16); mx.eval(x)
        bt, et, at = [], [], []
        for i in range(25):
            t0 = time.perf_counter(); out = sh.apply(Header.for_payload(Kind.DECODE, x, group=B), x); t1 = time.perf_counter()
            mx.eval(out); t2 = time.perf_counter(); bt.append(t1 - t0); et.append(t2 - t1)
        # async: build step i+1 while step i runs (as the 1-rank pipeline does)
        t0 = time.perf_counter(); prev = None
        for i in range(20):
            out = sh.apply(Header.for_payload(Kind.DECODE, x, group=B), x); mx.async_eval(out)
            if prev is not None: mx.eval(prev)
            prev = out
        mx.eval(prev); at = (time.perf_counter() - t0) / 20 * 1e3
        print(f"ranks {ranks} rank {rank} rows {B}: build {med(bt[5:]):.2f} ms eval {med(et[5:]):.2f} ms; async loop {at:.2f} ms/step", flush=True)
    del sh; mx.clear_cache()
