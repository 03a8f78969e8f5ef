# One layer's attention on one core, as each rank of tensor-2 runs it for the default model's last
# 512-token chunk (512 queries over 1,536 keys, head size 64, float32, causal): rank 0's 6 query heads
# over 2 KV heads (whole groups) against 5 over 5 (heads balanced, KV heads copied), and rank 1's.
#   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 taskset -c 1 python probe_heads.py
import time

import mlx.core as mx

L, S, D = 512, 1536, 64


def best_ms(h, kv, n=7):
    q, k, v = mx.random.normal((1, h, L, D)), mx.random.normal((1, kv, S, D)), mx.random.normal((1, kv, S, D))
    mx.eval(q, k, v)
    f = lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5, mask="causal")
    mx.eval(f())
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(f())
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


for name, h, kv in [("whole model", 9, 3), ("groups rank 0", 6, 2), ("groups rank 1", 3, 1),
                    ("balanced rank 0", 5, 5), ("balanced rank 1", 4, 4)]:
    print(f"{name:16} {h} heads over {kv} KV heads: {best_ms(h, kv):6.1f} ms")
