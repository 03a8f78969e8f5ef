"""Tensor mode's cut of a model: every rank keeps a 1/N share of every layer (attention heads with
their KV cache, MLP columns), joined by all_sums, by mlx-lm's own `shard()`."""

import mlx.core as mx
import mlx.nn as nn


def _heads(layer: nn.Module) -> tuple[int | None, int | None]:
    attn = getattr(layer, "self_attn", None) or getattr(layer, "attention", None)
    q = next((getattr(attn, k) for k in ("n_heads", "num_heads", "num_attention_heads") if hasattr(attn, k)), None)
    kv = next((getattr(attn, k) for k in ("n_kv_heads", "num_key_value_heads", "num_kv_heads") if hasattr(attn, k)), None)
    return q, kv


def split_model(model: nn.Module, group: mx.distributed.Group) -> None:
    """Cut every layer of `model` (built lazily, nothing read yet) to this rank's share of `group`."""
    kind = getattr(model, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    n = group.size()
    if not hasattr(model, "shard"):
        raise ValueError(f"{kind} models cannot run in tensor mode (mlx-lm has no shard() for them); use PARALLEL=pipeline")
    for i, layer in enumerate(model.layers):
        q, kv = _heads(layer)
        if q is None or kv is None or q % n or kv % n:
            raise ValueError(f"layer {i} of this {kind} model has {q} attention heads and {kv} KV heads, which do not divide "
                             f"among {n} ranks; use a number of ranks that divides both, or PARALLEL=pipeline")
    model.shard(group)
