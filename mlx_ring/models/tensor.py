"""How a model is cut for tensor mode: every rank keeps a share of every layer (attention heads by
groups of KV heads, MLP columns, experts' columns) and the layers' all_sums join the shares, so the
model's own forward gives the whole model's output on every rank.

The model's own mlx-lm `shard()` cuts it where it has one and its even split fits the group; otherwise
the standard layouts (q/k/v/o attention, gate/up/down or fc1/fc2 MLPs, and the experts of mixture-of-
experts blocks that mlx-lm can all_sum) are cut here with MLX's distributed layers, unevenly where the
KV heads do not divide. Which types that is right for is measured, as for the pipeline:
tests/ring/test_tensor_matrix.py runs every type's tiny model split 2 and 3 ways against the whole
model and records the result in supported.json (`tensor`); `tensor_shares` tells the planner, from a
config alone, whether and how a model splits N ways.
"""

import logging

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (AllToShardedLinear, QuantizedAllToShardedLinear, QuantizedShardedToAllLinear,
                                       ShardedToAllLinear)
from mlx.utils import tree_flatten

from mlx_ring.models.tensor_shares import check_admitted, even, refuse, spans

log = logging.getLogger(__name__)

# Attention modules name their query and KV head counts one of these ways.
HEAD_ATTRS = (("n_heads", "n_kv_heads"), ("num_attention_heads", "num_key_value_heads"), ("num_heads", "num_kv_heads"),
              ("num_heads", "num_key_value_heads"))
GROUP_ATTRS = ("num_key_value_groups", "n_kv_groups", "n_rep")  # query heads per KV head, where kept
OUT_NAMES = ("o_proj", "out_proj")
MLP_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"), ("fc1", None, "fc2"))
PER_HEAD = ("sinks",)  # attention parameters with one entry per query head
ENOUGH = 0.75  # a layer whose split parts hold less of its matrices than this is refused: it would be mostly replicated


def model_type(model: nn.Module) -> str:
    """The type a model was built for, as its config names it."""
    args = getattr(model, "args", None)
    return getattr(model, "model_type", None) or getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]


def split_model(model: nn.Module, group: mx.distributed.Group) -> None:
    """Cut every layer of `model` (built lazily) to this rank's share of the `group`, in place, so
    the model's unchanged forward gives the whole model's output on every rank; ValueError naming the
    type where it cannot be split this many ways."""
    kind = model_type(model)
    check_admitted(kind)
    cut(model, group, kind)


def cut(model: nn.Module, group: mx.distributed.Group, kind: str) -> str:
    """`split_model` without the admission check (the matrix test uses it to find the admitted types);
    returns how it was cut: "shard()" or "layouts"."""
    n = group.size()
    if n == 1:
        return "whole"
    uneven = _uneven(model, n)
    if hasattr(model, "shard") and not uneven:
        try:
            model.shard(group)
        except ValueError as e:
            raise refuse(kind, f"mlx-lm's shard() cannot split it {n} ways ({e})") from None
        return "shard()"
    work, why = _plan(model, n, group.rank())
    if why:
        reason = f"{why}" + (f", and mlx-lm's shard() splits evenly, which {uneven}" if uneven and hasattr(model, "shard") else "")
        raise refuse(kind, reason)
    for apply in work:
        apply(group)
    return "layouts"


def _uneven(model: nn.Module, n: int) -> str | None:
    """Why mlx-lm's even split cannot take this model n ways, or None."""
    for layer in model.layers:
        for _, m in layer.named_modules():
            for attr in {a for pair in HEAD_ATTRS for a in pair}:
                v = getattr(m, attr, None)
                if isinstance(v, int) and v % n:
                    return f"{v} {attr.replace('_', ' ')} do not divide by {n}"
            down = getattr(m, "down_proj", None)
            if down is not None and hasattr(down, "weight"):
                width, unit = _in_width(down)
                if width % n or (width // n) % unit:
                    return f"an MLP of {width} columns does not split into {n} whole groups of {unit}"
    return None


def _in_width(layer: nn.Module) -> tuple[int, int]:
    """A linear layer's input width and the unit it can be cut in (its quantization group)."""
    if hasattr(layer, "bits"):
        return layer.weight.shape[-1] * 32 // layer.bits, layer.group_size
    return layer.weight.shape[-1], 1


def _linear(m) -> bool:
    return isinstance(m, (nn.Linear, nn.QuantizedLinear))


def _plan(model: nn.Module, n: int, rank: int) -> tuple[list, str | None]:
    """The cuts that split every layer by the standard layouts, or why a layer cannot be."""
    work = []
    for i, layer in enumerate(model.layers):
        done, total = 0, sum(v.nbytes for _, v in tree_flatten(layer.parameters()) if v.ndim >= 2)
        for name, m in layer.named_modules():
            step, why, size = _attention(m, n, rank) if _is_attention(m) else (None, None, 0)
            if step is None and why is None:
                step, why, size = _mlp(m, n, rank)
            if why:
                return [], f"layer {i}'s {name or 'block'} ({type(m).__name__}): {why}"
            if step:
                work.append(step)
                done += size
        if total and done < ENOUGH * total:
            return [], (f"layer {i} ({type(layer).__name__}) has parts of no standard layout "
                        f"({100 * (total - done) // total}% of its weights would stay whole on every rank)")
    return work, None


def _is_attention(m: nn.Module) -> bool:
    return all(_linear(getattr(m, x, None)) for x in ("q_proj", "k_proj", "v_proj")) and any(
        _linear(getattr(m, x, None)) for x in OUT_NAMES)


def _heads(m: nn.Module) -> tuple[str, str] | None:
    return next((p for p in HEAD_ATTRS if isinstance(getattr(m, p[0], None), int) and isinstance(getattr(m, p[1], None), int)), None)


def _attention(m: nn.Module, n: int, rank: int):
    """(the cut, None, bytes) for a q/k/v/o attention split by KV-head groups, or (None, why, 0)."""
    names = _heads(m)
    if names is None:
        return None, "an attention without head counts this cut knows", 0
    heads, kv = getattr(m, names[0]), getattr(m, names[1])
    if kv < n:
        return None, f"{kv} KV heads cannot be shared by {n} ranks", 0
    if heads % kv:
        return None, f"{heads} query heads are not whole groups of {kv} KV heads", 0
    out_name = next(x for x in OUT_NAMES if _linear(getattr(m, x, None)))
    q, k, v, o = m.q_proj, m.k_proj, m.v_proj, getattr(m, out_name)
    per_q, per_k, per_v = _out(q) // heads, _out(k) // kv, _out(v) // kv
    o_in, unit = _in_width(o)
    per_o = o_in // heads
    g = heads // kv
    mine = spans(even(kv, n))[rank]
    for a, _ in spans(even(kv, n)):
        if (a * g * per_o) % unit:
            return None, f"its heads of {per_o} columns do not fill whole quantization groups of {unit}", 0
    size = sum(x.nbytes for x in (q, k, v, o) for _, x in tree_flatten(x.parameters()))

    def step(group):
        a, b = mine
        m.q_proj = _rows(q, a * g * per_q, b * g * per_q, group)
        m.k_proj = _rows(k, a * per_k, b * per_k, group)
        m.v_proj = _rows(v, a * per_v, b * per_v, group)
        setattr(m, out_name, _columns(o, a * g * per_o, b * g * per_o, group))
        for name in PER_HEAD:
            if isinstance(getattr(m, name, None), mx.array):
                setattr(m, name, getattr(m, name)[a * g:b * g])
        setattr(m, names[0], (b - a) * g)
        setattr(m, names[1], b - a)
        for name in GROUP_ATTRS:
            if isinstance(getattr(m, name, None), int):
                setattr(m, name, g)
    return step, None, size


def _mlp(m: nn.Module, n: int, rank: int):
    """(the cut, None, bytes) for a dense MLP or the experts of a block that all_sums them, or (None, None, 0)."""
    for names in MLP_NAMES:
        parts = [getattr(m, x, None) if x else None for x in names]
        if not all(p is not None for p, x in zip(parts, names) if x):
            continue
        gate, up, down = parts
        if all(_linear(p) for p in parts if p is not None):
            width, unit = _in_width(down)
            cols = spans(even(width, n, unit))[rank]
            size = sum(x.nbytes for p in parts if p is not None for _, x in tree_flatten(p.parameters()))

            def step(group, names=names, parts=parts, cols=cols):
                a, b = cols
                for name, p in zip(names[:2], parts[:2]):
                    if p is not None:
                        setattr(m, name, _rows(p, a, b, group))
                setattr(m, names[2], _columns(parts[2], a, b, group))
            return step, None, size
    if hasattr(m, "sharding_group") and hasattr(getattr(m, "switch_mlp", None), "down_proj"):
        return _experts(m, n, rank)
    return None, None, 0


def _experts(m: nn.Module, n: int, rank: int):
    """Experts' columns (and any shared experts') cut in place; the block all_sums its output itself."""
    blocks = [b for b in (m.switch_mlp, getattr(m, "shared_experts", None), getattr(m, "shared_expert", None)) if b is not None]
    plans = []
    for b in blocks:
        width, unit = _in_width(b.down_proj)
        plans.append((b, spans(even(width, n, unit))[rank]))
    size = sum(x.nbytes for b in blocks for _, x in tree_flatten(b.parameters()))

    def step(group):
        for b, (a, z) in plans:
            for name in ("gate_proj", "up_proj"):
                if hasattr(b, name):
                    _slice_in_place(getattr(b, name), a, z, rows=True)
            _slice_in_place(b.down_proj, a, z, rows=False, keep_bias=group.rank() == 0)
        m.sharding_group = group
    return step, None, size


def _out(layer) -> int:
    return layer.weight.shape[-2]


def _pack(layer) -> int:
    """Input columns per stored weight column (8 for 4-bit, 1 unquantized)."""
    return 32 // layer.bits if hasattr(layer, "bits") else 1


def _slice_in_place(layer: nn.Module, a: int, b: int, rows: bool, keep_bias: bool = True) -> None:
    """Keep output rows (or input columns) [a, b) of a linear or switch layer's parameters."""
    p = layer.parameters()
    if rows:
        new = {k: mx.contiguous(v[..., a:b] if k == "bias" else v[..., a:b, :]) for k, v in p.items()
               if isinstance(v, mx.array)}
    else:
        gs = getattr(layer, "group_size", 1)
        new = {"weight": mx.contiguous(p["weight"][..., a // _pack(layer):b // _pack(layer)])}
        for k in ("scales", "biases"):
            if isinstance(p.get(k), mx.array):
                new[k] = mx.contiguous(p[k][..., a // gs:b // gs])
        if "bias" in p and not keep_bias:  # summed over ranks afterwards: one rank adds it
            new["bias"] = mx.zeros_like(p["bias"])
    layer.update(new)


def _rows(layer, a: int, b: int, group) -> nn.Module:
    """An all-to-sharded layer holding output rows [a, b) of `layer`."""
    n, bias = group.size(), "bias" in layer
    if isinstance(layer, nn.QuantizedLinear):
        out = QuantizedAllToShardedLinear(_in_width(layer)[0], (b - a) * n, bias, layer.group_size, layer.bits,
                                          getattr(layer, "mode", "affine"), group=group)
    else:
        out = AllToShardedLinear(layer.weight.shape[1], (b - a) * n, bias, group=group)
    _slice_in_place(layer, a, b, rows=True)
    out.update({k: v for k, v in layer.parameters().items() if isinstance(v, mx.array)})
    return out


def _columns(layer, a: int, b: int, group) -> nn.Module:
    """A sharded-to-all layer holding input columns [a, b) of `layer`; it all_sums, then adds the bias."""
    n, bias = group.size(), "bias" in layer
    if isinstance(layer, nn.QuantizedLinear):
        out = QuantizedShardedToAllLinear((b - a) * n, _out(layer), bias, layer.group_size, layer.bits,
                                          getattr(layer, "mode", "affine"), group=group)
    else:
        out = ShardedToAllLinear((b - a) * n, _out(layer), bias, group=group)
    _slice_in_place(layer, a, b, rows=False)
    out.update({k: v for k, v in layer.parameters().items() if isinstance(v, mx.array)})
    return out
