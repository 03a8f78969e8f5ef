"""Does MLX's fused attention compile a kernel per key length? Times `mx.fast.scaled_dot_product_attention`
for 1, 2, 5 and 9 query positions over six new key lengths (first call, then the same length again),
with the "causal" string mask, an array mask, and plain matmuls and a softmax (what verify passes
use on CUDA: `mlx_ring.models.compat.unfused_attention`). Llama-3-8B's head shapes, bf16.

    python tools/probe_sdpa.py
"""

import time

import mlx.core as mx

H, KVH, D = 32, 8, 128
def t(f):
    t0 = time.perf_counter(); mx.eval(f()); return (time.perf_counter() - t0) * 1e3
def manual(q, k, v, mask):
    # grouped heads: repeat k/v (B, KVH, kL, D) -> (B, H, kL, D)
    k = mx.repeat(k, H // KVH, axis=1); v = mx.repeat(v, H // KVH, axis=1)
    s = (q * D**-0.5) @ k.swapaxes(-1, -2)
    s = mx.where(mask, s, -mx.inf)
    return mx.softmax(s.astype(mx.float32), axis=-1).astype(q.dtype) @ v
for qL in (1, 2, 5, 9):
    for kind in ("causal", "array", "manual"):
        first, again = [], []
        for kL in range(600, 606):
            q = mx.random.normal((1, H, qL, D)).astype(mx.bfloat16)
            k = mx.random.normal((1, KVH, kL, D)).astype(mx.bfloat16)
            v = mx.random.normal((1, KVH, kL, D)).astype(mx.bfloat16)
            mask = (mx.arange(kL - qL, kL)[:, None] >= mx.arange(kL)[None])
            mx.eval(q, k, v, mask)
            if kind == "manual":
                f = lambda: manual(q, k, v, mask)
            else:
                m = ("causal" if qL > 1 else None) if kind == "causal" else mask
                f = lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=m)
            first.append(t(f)); again.append(t(f))
        print(f"qL={qL} {kind:7s} first call per new kL: {sorted(first)[len(first)//2]:.2f} ms, same kL again: {sorted(again)[len(again)//2]:.3f} ms", flush=True)
