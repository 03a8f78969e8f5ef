"""How many bytes and FLOPs a model's layers hold, without loading a weight.

From the safetensors headers when the folder has them (exact), else from config.json alone, so the
dry run `./launch.sh plan --model <folder>` works with only a config.json: the tensors of the model
mlx-lm builds for the config (built lazily, nothing allocated: routed and shared experts, latent
attention, whatever the type has), at the dtype, or at the bits mlx-lm's quantization gives each
layer (its per-layer `quantization` entries included); from hidden and intermediate sizes where
mlx-lm cannot build it.
"""

import json
import re
import struct
from collections import Counter
from pathlib import Path

from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlx_ring.models.compat import model_classes
from mlx_ring.models.shape import read_shape, text_keys
from mlx_ring.planning.plan import ModelSpec

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "F32": 4, "F16": 2, "BF16": 2}
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _counts(c: dict) -> dict:
    """Parameter counts from a Hugging Face / mlx-lm config (its shape as models/shape.py reads
    it): per layer (all and active) and the ends. KeyError naming a size the config lacks."""
    s = read_shape(c)
    for key, size in (
        ("hidden_size", s.hidden_size),
        ("num_hidden_layers", s.layers),
        ("num_attention_heads", s.heads),
        ("vocab_size", s.vocab_size),
    ):
        if not size:
            raise KeyError(key)
    h, L, V, nh, nkv, d = s.hidden_size, s.layers, s.vocab_size, s.heads, s.kv_heads, s.head_dim
    attn = h * nh * d + 2 * h * nkv * d + nh * d * h
    if s.attention_bias or s.model_type == "qwen2":
        attn += nh * d + 2 * nkv * d
    norms = 2 * h + (2 * d if s.model_type.startswith("qwen3") else 0)
    experts = s.experts
    width = s.expert_width if experts else 0
    if not (width or s.intermediate_size):
        raise KeyError("intermediate_size")
    # The arrays a layer makes per token: norms, residuals and projections of the hidden size,
    # queries (and their rotated copy), keys and values, the MLP's gate, up, activation and product.
    flow = 6 * h + 2 * nh * d + 2 * nkv * d
    if experts:
        moe_i = width or s.intermediate_size
        k = s.experts_per_token
        shared_i = s.shared_expert_width
        shared = 3 * h * shared_i + (h if shared_i else 0)
        mlp, active_mlp = (
            experts * 3 * h * moe_i + h * experts + shared,
            k * 3 * h * moe_i + h * experts + shared,
        )
        # each token's copy per expert it is routed to
        flow += 4 * (k * moe_i + shared_i) + k * h + experts
    else:
        mlp = active_mlp = 3 * h * s.intermediate_size
        flow += 4 * s.intermediate_size
    # Latent attention (DeepSeek-V2/V3) caches one compressed vector and one rotary key per token.
    kv = s.kv_lora_rank + s.rope_head_dim if s.kv_lora_rank else 2 * nkv * d
    return {
        "layer": attn + mlp + norms,
        "active": attn + active_mlp + norms,
        "linear": attn + mlp,
        "embed": V * h,
        "head": 0 if s.tied else V * h,
        "norm": h,
        "kv": kv,
        "n_layers": L,
        "vocab_hidden": V * h,
        "flow": flow,
        "heads": nh,
        "vocab": V,
        "context": s.context_length,
    }


def _shape(n: dict, act: int) -> dict:
    """ModelSpec's fields for the activations estimate (activations.py), from `_counts`."""
    return {
        "act_bytes_per_token": float(n["flow"] * act),
        "heads": n["heads"],
        "vocab": n["vocab"],
        "context_length": n["context"],
    }


def parameter_count(c: dict) -> int:
    """The model's parameters, from its config (embedding and head counted apart unless tied; 0
    where the config lacks the sizes)."""
    try:
        n = _counts(c)
    except (KeyError, TypeError, ZeroDivisionError):
        return 0
    return int(n["n_layers"] * n["layer"] + n["embed"] + n["head"] + n["norm"])


# Elements of one sequence's fixed state in a layer that keeps one instead of keys and values.
# its short convolution's inputs
STATE_ELEMENTS = {"lfm2": lambda c: (c["conv_L_cache"] - 1) * c["hidden_size"]}


def cache_layout(config: dict, act: int) -> dict:
    """ModelSpec's cache-kind fields from the caches mlx-lm makes for the model's layers (its own
    `make_cache`, on the model built lazily: no weight is made or read). A type mlx-lm does not know
    counts as full attention in every layer, the largest reserve."""
    try:
        model_cls, args_cls = model_classes(config)
        caches = make_prompt_cache(model_cls(args_cls.from_dict(config)))
    # an unknown model_type, or a config mlx-lm cannot build
    except (ValueError, KeyError, TypeError):
        return {}
    n = len(caches)
    windows = [c.max_size for c in caches if getattr(c, "max_size", None)]
    states = sum(1 for c in caches if not hasattr(c, "offset"))  # no positions: a fixed state
    state = STATE_ELEMENTS.get(config.get("model_type"), lambda _: 0)(text_keys(config)) * act
    return {
        "kv_window_share": len(windows) / n,
        "kv_window": max(windows, default=0),
        "state_share": states / n,
        "state_bytes": float(state),
    }


def _quantization(c: dict) -> dict | None:
    q = c.get("quantization") or c.get("quantization_config")
    return q if isinstance(q, dict) and q.get("bits") else None


def _weight_bytes(path: str, size: int, ndim: int, q: dict | None, act: int) -> float:
    """Bytes of one tensor as mlx-lm stores it: matrices at their layer's quantization (a
    per-layer entry in `quantization` overrides the default; `false` keeps the layer in float),
    the rest in float."""
    if not q or ndim < 2 or not path.endswith("weight"):
        return size * act
    own = q.get(path.rsplit(".", 1)[0], q)
    if own is False:
        return size * act
    own = own if isinstance(own, dict) else q
    return size * (
        own.get("bits", q["bits"]) / 8 + 4 / own.get("group_size", q.get("group_size", 64))
    )


def tensor_sizes(c: dict) -> dict | None:
    """Per-layer and end sizes from the tensors of the model mlx-lm builds for config `c`
    (lazily: no weight is made): {"layers": [bytes per layer], "active": [bytes a token reads per
    layer], "params_active": [active parameters per layer], "ends", "head", "embed"}; None where
    mlx-lm cannot build it."""
    try:
        model_cls, args_cls = model_classes(c)
        model = model_cls(args_cls.from_dict(c))
        params = tree_flatten(model.parameters())
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, NotImplementedError):
        return None
    shape = read_shape(c)
    act = DTYPE_BYTES.get(shape.dtype, 2)
    q = _quantization(c)
    k = shape.experts_per_token
    n = len(model.layers)
    layers, active, params_active = [0.0] * n, [0.0] * n, [0.0] * n
    ends = head = embed = 0.0
    for path, v in params:
        b = _weight_bytes(path, v.size, v.ndim, q, act)
        m = LAYER_KEY.search(path)
        if m:
            i = int(m.group(1))
            # Routed experts: stacked along the first axis, k of them read per token.
            share = (
                min(1.0, k / v.shape[0])
                if v.ndim == 3 and ("switch" in path or "experts" in path)
                else 1.0
            )
            layers[i] += b
            active[i] += b * share
            params_active[i] += v.size * share
        else:
            ends += b
            head += b if "lm_head" in path else 0
            embed += b if "embed" in path or "wte" in path else 0
    return {
        "layers": layers,
        "active": active,
        "params_active": params_active,
        "ends": ends,
        "head": head,
        "embed": embed,
    }


def spec_from_config(c: dict, name: str = "") -> ModelSpec:
    """An estimate from config.json alone: dense or MoE layers, tied or untied head, any dtype or
    mlx-lm quantization (`bits` per weight plus a float16 scale and bias per `group_size`, per layer
    where the config says so)."""
    n, shape = _counts(c), read_shape(c)
    dtype = shape.dtype
    act = DTYPE_BYTES.get(dtype, 2)
    q = _quantization(c)
    # mlx-lm quantizes every linear layer and the embedding; norms stay in float.
    per_weight = q["bits"] / 8 + 4 / q.get("group_size", 64) if q else act
    layer = n["linear"] * per_weight + (n["layer"] - n["linear"]) * act
    read = layer * n["active"] / n["layer"]
    ends = (n["embed"] + n["head"]) * per_weight + n["norm"] * act
    head_read = n["vocab_hidden"] * per_weight
    label = f"{q['bits']}-bit" if q else dtype
    exact = tensor_sizes(c)
    if exact:
        L = len(exact["layers"])
        layer, read, ends = sum(exact["layers"]) / L, sum(exact["active"]) / L, exact["ends"]
        head_read = exact["head"] or exact["embed"]
        flops = 2.0 * sum(exact["params_active"]) / L
        return ModelSpec(
            L,
            layer,
            ends,
            head_read,
            n["kv"] * act,
            read,
            flops,
            2.0 * n["vocab_hidden"],
            label,
            name,
            shape.hidden_size * act,
            **cache_layout(c, act),
            **_shape(n, act),
        )
    return ModelSpec(
        n["n_layers"],
        layer,
        ends,
        head_read,
        n["kv"] * act,
        read,
        2.0 * n["active"],
        2.0 * n["vocab_hidden"],
        label,
        name,
        shape.hidden_size * act,
        **cache_layout(c, act),
        **_shape(n, act),
    )


def safetensors_sizes(folder: Path) -> dict[str, tuple[str, int]]:
    """`name -> (dtype, bytes)` of every tensor in the folder's *.safetensors files,
    headers only; in a folder holding one host's slice, the whole model's, from the
    manifest sent with it."""
    sent = folder / "ring-manifest.json"  # hosts/weights.py MANIFEST
    if sent.is_file():
        return {k: tuple(v) for k, v in json.loads(sent.read_text())["tensors"].items()}
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (v["dtype"], v["data_offsets"][1] - v["data_offsets"][0])
    return out


def spec_from_folder(folder: Path) -> ModelSpec:
    """Exact bytes per layer and of the ends from the weight files' headers where there are any."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(
            f"cannot read {folder / 'config.json'} ({e}); --model must be a folder with config.json"
        ) from None
    try:
        est = spec_from_config(config, folder.name)
    except KeyError as e:
        raise ValueError(
            f"{folder / 'config.json'} lacks {e}; the planner needs hidden_size, "
            "num_hidden_layers, num_attention_heads, intermediate_size and vocab_size"
        ) from None
    tensors = safetensors_sizes(folder)
    if not tensors:
        return est
    per_layer = Counter()
    ends = head = embed = 0
    for k, (_, nbytes) in tensors.items():
        m = LAYER_KEY.search(k)
        if m:
            per_layer[int(m.group(1))] += nbytes
        else:
            ends += nbytes
            head += nbytes if "lm_head" in k else 0
            embed += nbytes if "embed_tokens" in k else 0
    floats = Counter(d for d, _ in tensors.values() if d in SAFETENSORS_DTYPES)
    dtype = SAFETENSORS_DTYPES[floats.most_common(1)[0][0]] if floats else est.dtype
    act = DTYPE_BYTES[dtype]
    layer = sum(per_layer.values()) / est.n_layers
    quant = any(d == "U32" for d, _ in tensors.values())
    n = _counts(config)
    return ModelSpec(
        est.n_layers,
        layer,
        ends,
        head or embed,
        n["kv"] * act,
        layer * n["active"] / n["layer"],
        est.layer_flops,
        est.head_flops,
        f"{dtype} + quantized" if quant else dtype,
        folder.name,
        read_shape(config).hidden_size * act,
        **cache_layout(config, act),
        **_shape(n, act),
    )
