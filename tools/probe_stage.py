"""What a ring stage's layers cost on one device with no hop: a slice of a model's layers, one row a
decode step, timed three ways: building the step's graph in Python, a step built then evaluated at
once (as a ring stage runs it once its payload has come), and steps pipelined (the next built and
queued while this one runs, as one rank alone runs them). Compare with a ring's stage times from
`bench_steps.py --trace` to see what the hops add:

    python tools/probe_stage.py --model DIR --layers 8:16
"""

import argparse
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

STEPS = 200


def median_ms(ts: list[float]) -> float:
    return sorted(ts)[len(ts) // 2] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--layers", default="8:16", help="the slice, start:end (half-open)")
    a = p.parse_args()
    start, end = (int(v) for v in a.layers.split(":"))
    model, _ = load_model(a.model)
    layers, cache = model.layers[start:end], make_prompt_cache(model)[start:end]
    x = mx.random.normal((1, 1, model.args.hidden_size)).astype(mx.bfloat16)  # one row's hidden state
    mx.eval(x)

    def build(h: mx.array) -> mx.array:
        for layer, c in zip(layers, cache):
            h = layer(h, None, c)
        return h

    for _ in range(20):  # kernels built, caches allocated
        mx.eval(build(x))
    built, at_once = [], []
    for _ in range(STEPS):
        t = time.perf_counter()
        y = build(x)
        built.append(time.perf_counter() - t)
        mx.eval(y)
        at_once.append(time.perf_counter() - t)
    t = time.perf_counter()
    y = build(x)
    mx.async_eval(y)
    for _ in range(STEPS):
        z = build(x)
        mx.async_eval(z)
        mx.eval(y)
        y = z
    mx.eval(y)
    piped = (time.perf_counter() - t) / (STEPS + 1)
    print(f"layers {start}:{end}: building a step {median_ms(built):.3f} ms; built then evaluated at once "
          f"{median_ms(at_once):.3f} ms (median of {STEPS}); pipelined {piped * 1e3:.3f} ms a step", flush=True)


if __name__ == "__main__":
    main()
