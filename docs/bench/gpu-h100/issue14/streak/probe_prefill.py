"""A prompt of a length not seen before, on CUDA: the 8B target's prefill with the fused attention
kernel (compiled per key length when there are several positions) and with plain matmuls, fresh and
after a 1000-token cached prefix (a follow-up turn from the prompt cache)."""
import time
from pathlib import Path
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.models.cache import make_prompt_cache
from mlx_ring.models.compat import unfused_attention
model, _ = load_model(Path("/tmp/llama8b"))
def once(L, prefix, fused):
    cache = make_prompt_cache(model)
    if prefix:
        model(mx.full((1, prefix), 3, dtype=mx.int32), cache=cache); mx.eval([c.state for c in cache])
    t0 = time.perf_counter()
    with unfused_attention(not fused):
        out = model(mx.full((1, L), 5, dtype=mx.int32), cache=cache)
    mx.eval(out)
    return (time.perf_counter() - t0) * 1e3
once(100, 0, True); once(100, 0, False)  # warm both paths
for prefix in (0, 1000):
    for L in (17, 63, 250, 1021, 2039):
        f1 = once(L, prefix, True); f2 = once(L, prefix, True); u = once(L + 1, prefix, False)
        print(f"prefix={prefix} L={L}: fused new length {f1:.1f} ms, fused same length again {f2:.1f} ms, unfused (new length) {u:.1f} ms", flush=True)
