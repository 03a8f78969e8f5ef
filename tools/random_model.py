"""Random-weight MLX model folders of real shapes, for speed runs where weights don't matter (and
for the tests that need a real shape: `from tools.random_model import make_random_model`).

    python tools/random_model.py llama3-8b /tmp/llama3-8b [--dtype bfloat16]
        [--quiet-after 4 --quiet-scale 0.01]

The tokenizer (and so the vocabulary, 49152 tokens) is the default model's, so both this server
and mlx_lm.server can chat with the folder. Layers are written one file at a time, so making an
8B folder needs little more memory than one layer.
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_ring.models.compat import model_classes

SHAPES = {
    "llama3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    # The shape where one GPU's step is bound by reading its weights (cut to --layers 20:
    # 36 GB a token).
    "llama3-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    # Layers of 6.4 GB (bf16): a cut of 9 fills one 80 GB GPU, and on four a rank's step is still
    # bound by reading its weights, not by the host's per-layer work.
    "llama3-405b": {
        "model_type": "llama",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "qwen3-1.7b": {
        "model_type": "qwen3",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": True,
    },
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def make_random_model(
    shape: str,
    out: Path,
    tokenizer_from: Path,
    dtype: str = "bfloat16",
    quiet_after: int | None = None,
    quiet_scale: float = 1.0,
    **overrides,
) -> Path:
    """Write a random `shape` model to `out` with the tokenizer of `tokenizer_from`;
    `overrides` change config keys (fewer layers, say). Layers from `quiet_after` on have
    their output projections scaled by `quiet_scale`: they barely change the residual stream,
    so the model's first `quiet_after` layers (`early_exit_model.py`) agree with it often, a
    pair of models for timing a draft model where no real pair is offline (the smaller the
    scale, the more they agree)."""
    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    config = dict(SHAPES[shape], vocab_size=vocab, torch_dtype=dtype, **overrides)
    model_cls, args_cls = model_classes(config)
    n_layers = config["num_hidden_layers"]
    out.mkdir(parents=True, exist_ok=True)
    # shapes of the ends and one layer
    one = model_cls(args_cls.from_dict(dict(config, num_hidden_layers=1)))
    weight_map = {}
    dt = getattr(mx, dtype)
    for i in range(n_layers + 1):
        part = {}
        for k, v in tree_flatten(one.parameters()):
            # Matrices random, norm weights one: activations keep a sane scale through every layer.
            value = (
                (0.02 * mx.random.normal(v.shape)).astype(dt)
                if v.ndim > 1
                else mx.ones(v.shape, dt)
            )
            if (
                quiet_after is not None
                and i >= quiet_after
                and k.endswith(("o_proj.weight", "down_proj.weight"))
            ):
                value = (value * quiet_scale).astype(dt)
            if i < n_layers and k.startswith("model.layers.0."):
                part[k.replace("layers.0.", f"layers.{i}.")] = value
            elif i == n_layers and not k.startswith("model.layers."):
                part[k] = value
        name = f"model-{i:05d}.safetensors"
        mx.save_safetensors(str(out / name), part)
        weight_map |= {k: name for k in part}
        del part
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in TOKENIZER_FILES:
        if (tokenizer_from / f).exists():
            shutil.copy(tokenizer_from / f, out / f)
    return out


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        default=None,
        help="an MLX model folder (default: the default model)",
    )
    p.add_argument(
        "--quiet-after",
        type=int,
        default=None,
        help="scale the output projections of layers from this one on",
    )
    p.add_argument(
        "--quiet-scale", type=float, default=0.01, help="... by this (with --quiet-after)"
    )
    p.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="the shape's layers at a hidden size of 64 (4 heads, 2 KV heads, "
        "MLP 128): a step computes next to nothing, so its host work shows "
        "(bench_steps.py --split)",
    )
    a = p.parse_args()
    if a.tokenizer_from is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.tokenizer_from = resolve_model(None, CACHE_DIR, "auto")
    overrides = {"num_hidden_layers": a.layers} if a.layers else {}
    if a.tiny:
        overrides |= {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
        }
    print(
        make_random_model(
            a.shape, a.out, a.tokenizer_from, a.dtype, a.quiet_after, a.quiet_scale, **overrides
        )
    )


if __name__ == "__main__":
    main()
