"""A tiny random model of every text-decoder type mlx-lm ships, its config derived from the
type's own `ModelArgs`: every field mlx-lm declares gets a small value of its kind (widths,
heads, experts, latent ranks, windows, state sizes), so experts, latent attention, sliding
windows and recurrent or convolution states are kept, only small. Types that mlx-lm runs under
another's code (`MODEL_REMAPPING`: `kimi_k2` as `deepseek_v3`, ...) are types of their own here,
as users name them.

    python tests/model_zoo.py list                 # every type and the config it gets
    python tests/model_zoo.py make TYPE FOLDER [--bits 4]

The supported-model list (mlx_ring/models/supported.json) is what tests/ring/test_model_matrix.py
finds when these models run split across ranks; see docs/models.md.
"""

import argparse
import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path

import mlx.core as mx
import mlx_lm.models
from mlx.utils import tree_flatten
from mlx_lm.utils import MODEL_REMAPPING, quantize_model
from zoo_fields import FLOATS, SMALL, SWA, VOCAB
from zoo_types import OVERRIDES, TEXT_CLASSES, WRAPS

from mlx_ring.models.compat import model_classes

# Modules of mlx_lm.models that are parts of models, not model types.
NOT_TYPES = {
    "activations",
    "base",
    "bitlinear_layers",
    "cache",
    "gated_delta",
    "mla",
    "pipeline",
    "rope_utils",
    "ssm",
    "switch_layers",
}
MAX_PARAMETERS = 3_000_000


def text_decoder_types() -> list[str]:
    """Every model type mlx-lm 0.32 loads: its model modules, and the names it remaps
    to one of them."""
    mods = sorted(
        m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__) if m.name not in NOT_TYPES
    )
    return sorted(set(mods) | {k for k, v in MODEL_REMAPPING.items() if v in mods})


def _args_class(kind: str):
    try:
        return model_classes({"model_type": kind})[1]
    # a module that needs a package we do not install (olmo: ai2-olmo)
    except (ValueError, SystemExit) as e:
        raise ValueError(f"mlx-lm cannot import its {kind} module ({e})") from None


def _fill(args_cls, kind: str) -> dict:
    config = {}
    for f in dataclasses.fields(args_cls):
        if f.name in SMALL:
            config[f.name] = SMALL[f.name]
        elif f.name in FLOATS:
            config[f.name] = FLOATS[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            config[f.name] = SWA if f.name == "layer_types" else _required_default(f)
    config["model_type"] = kind
    return config


def _required_default(f) -> object:
    t = str(f.type).lower()
    if "list" in t:
        return []
    if "dict" in t:
        return {}
    if "bool" in t:
        return False
    if "float" in t:
        return 1.0
    if "int" in t:
        return 1
    return None


def tiny_config(kind: str) -> dict:
    """The config of `kind`'s tiny model: small values for every field of its
    ModelArgs, then its overrides."""
    args_cls = _args_class(kind)
    text_cls = next(
        (
            getattr(importlib.import_module(args_cls.__module__), n)
            for n in TEXT_CLASSES
            if hasattr(importlib.import_module(args_cls.__module__), n)
        ),
        None,
    )
    if kind in WRAPS:
        text = tiny_config(WRAPS[kind])
        config = {
            "model_type": kind,
            "vocab_size": VOCAB,
            "text_config": text.get("text_config", text),
        }
    elif text_cls is not None and any(
        f.name == "text_config" for f in dataclasses.fields(args_cls)
    ):
        config = {"model_type": kind, "vocab_size": VOCAB, "text_config": _fill(text_cls, kind)}
    else:
        config = _fill(args_cls, kind)
    return _merge(config, OVERRIDES.get(kind, {}))


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build(config: dict, seed: int = 0):
    """The model mlx-lm builds for `config`, with random weights that every one matters (norms and
    biases perturbed too), seeded for repeatability."""
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    # lazy: nothing is allocated before the size check
    model = model_cls(args_cls.from_dict(config))
    sizes = sorted(((v.size, k) for k, v in tree_flatten(model.parameters())), reverse=True)
    if sum(n for n, _ in sizes) > MAX_PARAMETERS:
        raise ValueError(
            f"{config['model_type']}: the tiny config is not tiny ({sum(n for n, _ in sizes)} "
            f"parameters, the largest {sizes[:3]}); give the field that sizes it a small value "
            "in SMALL or OVERRIDES"
        )
    params = [
        (k, v + 0.02 * mx.random.normal(v.shape).astype(v.dtype))
        for k, v in tree_flatten(model.parameters())
    ]
    model.load_weights(params)
    mx.eval(model.parameters())
    return model


def make(
    kind: str, folder: Path, bits: int = 0, changes: dict | None = None, seed: int = 0
) -> Path:
    """Write `kind`'s tiny model to `folder` (config.json and model.safetensors; no
    tokenizer: tests feed token ids); `bits` 4 or 8: quantized as `mlx_lm.convert` quantizes
    (groups of 32); `changes`: merged into its config (a variant: other sizes, another layer
    count), `seed`: other weights."""
    config = _merge(tiny_config(kind), changes or {})
    model = build(config, seed)
    if bits:
        model, config = quantize_model(model, config, group_size=32, bits=bits)
    # The layer count where the ring's plan reads it, whatever the type names it
    # (n_layers, text_config, ...).
    config.setdefault("num_hidden_layers", len(model.layers))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    m = sub.add_parser("make")
    m.add_argument("kind")
    m.add_argument("out", type=Path)
    m.add_argument("--bits", type=int, default=0)
    a = p.parse_args()
    if a.cmd == "list":
        for kind in text_decoder_types():
            try:
                print(kind, json.dumps(tiny_config(kind)))
            except ValueError as e:
                print(kind, f"-- {e}")
    else:
        print(make(a.kind, a.out, a.bits))


if __name__ == "__main__":
    main()
