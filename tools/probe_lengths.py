"""Does a prompt of a new length cost more to prefill than the same length again (CUDA plans a
matmul of each new shape on first use), and does prefilling every length up to a chunk once, as
the server's warm-up does on CUDA, take that cost away? Prefills one prompt at a time through
mlx-lm's model, attention unfused as the server's prefill is on CUDA.

    python tools/probe_lengths.py /tmp/m [--chunk 512]
"""

import argparse
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlx_ring.models.compat import unfused_attention


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path)
    p.add_argument("--chunk", type=int, default=512)
    a = p.parse_args()
    model, _ = load_model(a.model)

    def prefill_ms(n: int) -> float:
        cache = make_prompt_cache(model)
        tokens = mx.array([[7 + i % 100 for i in range(n)]])
        t0 = time.perf_counter()
        with unfused_attention(mx.cuda.is_available()):
            out = model(tokens, cache=cache)
        mx.eval(out, [c.state for c in cache])
        return (time.perf_counter() - t0) * 1e3

    prefill_ms(30), prefill_ms(30)  # the first ever call builds what every length needs
    for n in (40, 41, 77, 200, 333):
        print(f"length {n}: new {prefill_ms(n):.1f} ms, again {prefill_ms(n):.1f} ms", flush=True)
    t0 = time.perf_counter()
    for n in range(1, a.chunk + 1):
        prefill_ms(n)
    print(f"every length 1..{a.chunk} prefilled once: {time.perf_counter() - t0:.1f} s", flush=True)
    for n in (45, 150, 401, a.chunk + 88):
        print(f"after that, length {n}: first {prefill_ms(n):.1f} ms, again {prefill_ms(n):.1f} ms", flush=True)


if __name__ == "__main__":
    main()
