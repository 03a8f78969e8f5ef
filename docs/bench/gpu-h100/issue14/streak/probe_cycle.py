"""Where a draft cycle's time goes on CUDA: matmuls by row count, the 8B target's pass by positions
(fused / unfused attention), and the draft model's propose() by catch-up length."""
import sys, time
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.models.cache import make_prompt_cache
from mlx_ring.models.compat import unfused_attention
from mlx_ring.serving.speculative import ModelDrafter

def med(ts):
    ts = sorted(ts); return ts[len(ts) // 2] * 1e3

# A. matmuls: (M, K) @ (K, N), bf16, 8 distinct weights per eval (so none stays in L2)
for K, N in ((4096, 4096), (4096, 14336), (14336, 4096)):
    ws = [mx.random.normal((N, K)).astype(mx.bfloat16) for _ in range(8)]
    mx.eval(ws)
    line = []
    for M in (1, 2, 3, 4, 5, 6, 8, 16, 32):
        x = mx.random.normal((M, K)).astype(mx.bfloat16); mx.eval(x)
        ts = []
        for i in range(12):
            t0 = time.perf_counter(); mx.eval([x @ w.T for w in ws]); ts.append(time.perf_counter() - t0)
        line.append(f"M={M}:{med(ts[2:]) / 8:.3f}")
    print(f"A matmul K={K} N={N} ms each:", " ".join(line), flush=True)

# B. the 8B target: one pass of L positions over a ~300-token cache growing by one each time
model, _ = load_model(Path("/tmp/llama8b"))
for fused in (True, False):
    for L in (1, 2, 3, 4, 5, 6, 8):
        cache = make_prompt_cache(model)
        model(mx.zeros((1, 300), dtype=mx.int32), cache=cache); mx.eval([c.state for c in cache])
        ts = []
        for i in range(14):
            t0 = time.perf_counter()
            with unfused_attention(not fused and L > 1):
                out = model(mx.full((1, L), 7, dtype=mx.int32), cache=cache)
            mx.eval(out); ts.append(time.perf_counter() - t0)
            for c in cache: c.trim(L - 1)
        print(f"B target L={L} {'fused' if fused else 'unfused'}: {med(ts[3:]):.2f} ms (first {ts[0]*1e3:.1f})", flush=True)
        if fused and L > 2: break  # fused compiles per key length: known
del model; mx.clear_cache()

# C. the draft model: propose() after a gap of g new tokens (the catch-up), k drafts
draft, _ = load_model(Path("/tmp/draft17"))
for k in (1, 2, 4):
    for gap in (1, 4, 16, 64):
        d = ModelDrafter(8, model=draft); d.k = k
        hist = list(range(5, 305))
        d.propose(hist); ts = []
        for i in range(8):
            hist = hist + [11] * gap
            t0 = time.perf_counter(); d.propose(hist); ts.append(time.perf_counter() - t0)
        print(f"C draft k={k} gap={gap}: {med(ts[2:]):.2f} ms (first {ts[0]*1e3:.1f})", flush=True)
