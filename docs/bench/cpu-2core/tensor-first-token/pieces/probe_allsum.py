# A (512, 576) float32 all_sum over 2 ranks, whole and in 2, 4 or 8 row pieces, each rank on a core:
#   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python tools/fed.py mlx.launch --backend ring \
#       --hostfile h2.json -- python tools/pinned.py 0/1 -- python probe_allsum.py
import time, mlx.core as mx
w = mx.distributed.init()
x = mx.random.normal((512, 576)); mx.eval(x)
def split_sum(x, k):
    parts = mx.split(x, k, axis=0) if k > 1 else [x]
    return mx.concatenate([mx.distributed.all_sum(p, group=w) for p in parts], axis=0)
for k in (2, 1, 2, 4, 1, 2, 8):
    for _ in range(3): mx.eval(split_sum(x, k))
    t0 = time.perf_counter(); n = 60
    for _ in range(n): mx.eval(split_sum(x, k))
    dt = (time.perf_counter() - t0) / n * 1e3
    if w.rank() == 0: print(k, "pieces: all_sum of (512, 576) f32 %.2f ms" % dt, flush=True)
