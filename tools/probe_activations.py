"""What a ring stage's forward pass holds beyond its weights and caches, measured, beside the plan's
estimate (mlx_ring/planning/activations.py): a slice of a model's layers takes a prompt of
`--context` tokens in chunks, then one more chunk of `--chunk` tokens is built as one graph and
evaluated, as a rank runs its stage of a prefill chunk; MLX's peak during it, less what was in use
before and after it, is what its intermediates took.

    python tools/probe_activations.py --model DIR --layers 0:15 --chunk 128 --context 2048
"""

import argparse
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlx_ring.planning.activations import activation_bytes
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.probe import device_info
from mlx_ring.planning.sizes import spec_from_folder

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--layers", default="", help="the slice, start:end (half-open); default every layer")
    p.add_argument("--chunk", type=int, default=512, help="prompt tokens in the measured chunk")
    p.add_argument("--context", type=int, default=2048, help="tokens already in the cache before it")
    a = p.parse_args()
    model, _ = load_model(a.model)
    start, end = (int(v) for v in a.layers.split(":")) if a.layers else (0, len(model.layers))
    layers, cache = model.layers[start:end], make_prompt_cache(model)[start:end]
    dtype = model.model.embed_tokens.weight.dtype if hasattr(model.model.embed_tokens, "weight") else mx.float16
    dtype = dtype if dtype in (mx.float32, mx.float16, mx.bfloat16) else mx.float16  # quantized: its scales'
    hidden = model.args.hidden_size

    def stage(tokens: int) -> mx.array:
        h = mx.random.normal((1, tokens, hidden)).astype(dtype)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(layers, cache):
            h = layer(h, mask, c)
        return h

    for done in range(0, a.context, a.chunk):  # the prompt before: not measured
        mx.eval(stage(min(a.chunk, a.context - done)))
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    mx.eval(stage(a.chunk))
    mx.synchronize()
    after, peak = mx.get_active_memory(), mx.get_peak_memory()
    info = device_info()
    cap = Capabilities("here", 1, 1, 1, 1, str(info.get("device_name") or mx.default_device()),
                       working_set_gb=float(info.get("max_recommended_working_set_size", 0)) / 2**30)
    spec = replace(spec_from_folder(a.model), prefill_chunk=a.chunk, max_active=1)
    estimate = activation_bytes(spec, cap, 1, end - start, a.context + a.chunk)
    print(f"{cap.device}: layers [{start}, {end}), a {a.chunk}-token chunk after {a.context} tokens: "
          f"intermediates {(peak - max(before, after)) / MIB:.1f} MiB measured (peak {peak / MIB:.1f} MiB, in use "
          f"{before / MIB:.1f} MiB before, {after / MIB:.1f} MiB after); estimate {estimate / MIB:.1f} MiB")


if __name__ == "__main__":
    main()
