"""How a model is cut for tensor mode: every rank keeps a share of every layer (attention heads by
groups of KV heads, MLP columns, experts' columns) and the layers' all_sums join the shares, so the
model's own forward gives the whole model's output on every rank.

The model's own mlx-lm `shard()` cuts it where it has one and its even split fits the group.
Otherwise the standard layouts are cut here with MLX's distributed layers (`layers.py`),
unevenly where the KV heads do not divide, and with a KV head kept by each rank that reads it where
there are fewer KV heads than ranks: attention with q/k/v (or one fused qkv) and an output
projection, MLPs of gate/up/down (or fused gate_up, or two layers), and mixture-of-experts blocks of
switch layers. What is of another layout is refused. Which types the cut is right for is measured,
as for the pipeline: tests/ring/test_tensor_matrix.py runs every type's tiny model split 2 and 3
ways against the whole model and records the result in supported.json (`tensor`); `shares.py`
tells the planner, from a config alone, whether and how a model splits N ways.
"""

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from mlx_ring.tensor.layers import (
    SplitRMSNorm,
    Sum,
    SummedOutput,
    columns,
    in_width,
    is_linear,
    out_width,
    rows,
    slice_columns,
    slice_rows,
    sum_with,
)
from mlx_ring.tensor.shares import check_admitted, even, head_split, refuse, spans
from mlx_ring.tensor.sums import summing

# Attention modules name their query and KV head counts one of these ways.
HEAD_ATTRS = (
    ("n_heads", "n_kv_heads"),
    ("num_attention_heads", "num_key_value_heads"),
    ("num_heads", "num_kv_heads"),
    ("num_heads", "num_key_value_heads"),
)
# query heads per KV head, where kept
GROUP_ATTRS = ("num_key_value_groups", "n_kv_groups", "n_rep", "repeats")
OUT_NAMES = ("o_proj", "out_proj", "dense")
# MLPs: the layers that make the columns (gate and up, or one of them), then the
# one that takes them.
MLP_NAMES = (
    ("gate_proj", "up_proj", "down_proj"),
    ("w1", "w3", "w2"),
    ("c_fc_0", "c_fc_1", "c_proj"),
    ("up_proj", None, "down_proj"),
    ("fc1", None, "fc2"),
    ("c_fc", None, "c_proj"),
)
EXPERT_NAMES = ("switch_mlp", "experts")
SHARED_NAMES = ("shared_experts", "shared_expert", "shared_mlp")
PER_HEAD = ("sinks",)  # attention parameters with one entry per query head
# a layer whose split parts hold less of its matrices than this is refused: it
# would be mostly replicated
ENOUGH = 0.75


def model_type(model: nn.Module) -> str:
    """The type a model was built for, as its config names it."""
    args = getattr(model, "args", None)
    module = type(model).__module__.rsplit(".", 1)[-1]
    return getattr(model, "model_type", None) or getattr(args, "model_type", None) or module


def split_model(model: nn.Module, group: mx.distributed.Group) -> None:
    """Cut every layer of `model` (built lazily) to this rank's share of the `group`, in place,
    so the model's unchanged forward gives the whole model's output on every rank, its layers
    summing with `sums.summing(group)`; ValueError naming the type where it cannot be split this
    many ways."""
    kind = model_type(model)
    if group.size() > 1:  # one rank holds the whole model, whatever its type
        check_admitted(kind)
    cut(model, group, kind, summing(group))


def cut(model: nn.Module, group: mx.distributed.Group, kind: str, all_sum: Sum) -> str:
    """`split_model` without the admission check (the matrix test uses it to find the admitted
    types), its layers summing with `all_sum`; returns how it was cut: "shard()" (mlx-lm's) or
    "layouts" (here)."""
    n = group.size()
    if n == 1:
        return "whole"
    uneven = _uneven(model, n)
    if hasattr(model, "shard") and not uneven:
        try:
            model.shard(group)
        except (ValueError, AssertionError) as e:  # Qwen 3.5's asserts that the vocabulary divides
            raise refuse(kind, f"mlx-lm's shard() cannot split it {n} ways ({e})") from None
        # Its sharded-to-all layers call MLX's all_sum by name; sums inside a model's own forward
        # (a mixture of experts' `sharding_group`) stay MLX's.
        sum_with(model, all_sum)
        return "shard()"
    work, why = _plan(model, n, group.rank())
    if why:
        even_only = (
            f", and mlx-lm's shard() splits evenly, which {uneven}"
            if hasattr(model, "shard")
            else ""
        )
        raise refuse(kind, why + even_only)
    for apply in work:
        apply(group, all_sum)
    return "layouts"


def _uneven(model: nn.Module, n: int) -> str | None:
    """Why mlx-lm's even split cannot take this model n ways, or None."""
    for layer in model.layers:
        for _, m in layer.named_modules():
            for attr in {a for pair in HEAD_ATTRS for a in pair}:
                v = getattr(m, attr, None)
                if isinstance(v, int) and v % n:
                    return f"its {v} heads ({attr}) do not divide by {n}"
            down = getattr(m, "down_proj", None)
            if down is not None and hasattr(down, "weight"):
                width, unit = in_width(down)
                if width % n or (width // n) % unit:
                    return (
                        f"an MLP of {width} columns does not split into {n} whole groups of {unit}"
                    )
    return None


def _bytes(m: nn.Module) -> int:
    """Bytes of a module's matrices (norms and biases aside)."""
    return sum(v.nbytes for _, v in tree_flatten(m.parameters()) if v.ndim >= 2)


def _plan(model: nn.Module, n: int, rank: int) -> tuple[list, str | None]:
    """The cuts that split every layer by the standard layouts, or why a layer cannot be."""
    work = []
    for i, layer in enumerate(model.layers):
        split = {}  # name -> bytes of each module a cut takes
        for name, m in layer.named_modules():  # parents come before their children
            if any(name.startswith(f"{s}.") for s in split):
                continue
            step, why = (None, None)
            if _is_attention(m):
                step, why = _attention(m, n, rank)
            elif _expert_block(m):
                step, why = _experts(layer, name, m, n, rank)
            else:
                step = _mlp(m, n, rank)
            if why:
                return [], f"layer {i}'s {name or 'block'} ({type(m).__name__}): {why}"
            if step:
                work.append(step)
                split[name] = _bytes(m)
        total = _bytes(layer)
        if total and sum(split.values()) < ENOUGH * total:
            whole = {
                name: _bytes(c)
                - sum(v for s, v in split.items() if s == name or s.startswith(f"{name}."))
                for name, c in layer.children().items()
                if isinstance(c, nn.Module)
            }
            name = max(whole, key=whole.get)
            whole_share = 100 * (total - sum(split.values())) // total
            return [], (
                f"layer {i}'s {name} ({type(getattr(layer, name)).__name__}) is of no layout this "
                f"split knows, and {whole_share}% of the layer would stay whole on every rank"
            )
    return work, None


def _is_attention(m: nn.Module) -> bool:
    qkv = all(is_linear(getattr(m, x, None)) for x in ("q_proj", "k_proj", "v_proj")) or is_linear(
        getattr(m, "qkv_proj", None)
    )
    return qkv and any(is_linear(getattr(m, x, None)) for x in OUT_NAMES)


def _attention(m: nn.Module, n: int, rank: int):
    """(the cut, None) for an attention split by its heads (`head_split`), or (None, why)."""
    names = next(
        (p for p in HEAD_ATTRS if all(isinstance(getattr(m, a, None), int) for a in p)), None
    )
    if names is None:
        return None, "an attention without head counts this split knows"
    heads, kv = getattr(m, names[0]), getattr(m, names[1])
    try:
        split = head_split(heads, kv, n)
    except ValueError as e:
        return None, str(e)
    mine = split[rank]
    out_name = next(x for x in OUT_NAMES if is_linear(getattr(m, x, None)))
    o = getattr(m, out_name)
    o_in, unit = in_width(o)
    per_o = o_in // heads
    # Each projection's parts: (first row, rows per head, whether its heads are queries), in the
    # order the forward splits them.
    if is_linear(getattr(m, "qkv_proj", None)):
        if out_width(m.qkv_proj) != (heads + 2 * kv) * per_o:
            return None, "its fused qkv_proj is not queries, keys and values of one head size"
        parts = {
            "qkv_proj": [
                (0, per_o, True),
                (heads * per_o, per_o, False),
                ((heads + kv) * per_o, per_o, False),
            ]
        }
    else:
        parts = {
            "q_proj": [(0, out_width(m.q_proj) // heads, True)],
            "k_proj": [(0, out_width(m.k_proj) // kv, False)],
            "v_proj": [(0, out_width(m.v_proj) // kv, False)],
        }
    q_width, k_width = (
        heads * parts.get("q_proj", [(0, per_o)])[0][1],
        kv * parts.get("k_proj", [(0, per_o)])[0][1],
    )
    if any((h.start * per_o) % unit for h in split):
        return None, f"its heads of {per_o} columns do not fill whole quantization groups of {unit}"
    extra, norms = {}, {}
    for name, c in m.children().items():
        if name in ("q_proj", "k_proj", "v_proj", "qkv_proj", out_name) or not isinstance(
            c, nn.Module
        ):
            continue
        # a gate on each head's output (or its scalar)
        if is_linear(c) and out_width(c) in (heads * per_o, heads):
            extra[name] = (c, out_width(c) // heads)
        elif isinstance(c, nn.RMSNorm) and c.weight.shape[-1] in (q_width, k_width) and heads > 1:
            # A norm over all heads' queries or keys: each rank's part of it, its squares summed
            # over the ranks.
            if c.weight.shape[-1] == k_width and kv < n:
                return None, (
                    f"its {name} is a norm over every KV head's keys, which ranks sharing KV "
                    "heads would count twice"
                )
            norms[name] = (c, q_width // heads if c.weight.shape[-1] == q_width else k_width // kv)
        elif is_linear(c) or any(v.ndim >= 2 for _, v in tree_flatten(c.parameters())):
            return None, f"its {name} ({type(c).__name__}) is of no layout this split knows"

    def heads_rows(start: int, per: int, query: bool) -> list[tuple[int, int]]:
        return (
            [(start + mine.start * per, start + mine.end * per)]
            if query
            else _joined([(start + j * per, start + (j + 1) * per) for j in mine.kv])
        )

    def step(group, all_sum):
        for name, segments in parts.items():
            setattr(
                m,
                name,
                rows(getattr(m, name), [r for s in segments for r in heads_rows(*s)], group),
            )
        for name, (c, per) in extra.items():
            setattr(m, name, rows(c, heads_rows(0, per, True), group))
        for name, (c, per) in norms.items():
            ((a, b),) = heads_rows(0, per, c.weight.shape[-1] == q_width)
            setattr(m, name, SplitRMSNorm(c.weight[a:b], c.eps, c.weight.shape[-1], all_sum))
        setattr(m, out_name, columns(o, mine.start * per_o, mine.end * per_o, group, all_sum))
        for name in PER_HEAD:
            if isinstance(getattr(m, name, None), mx.array):
                setattr(m, name, getattr(m, name)[mine.start : mine.end])
        setattr(m, names[0], mine.end - mine.start)
        setattr(m, names[1], len(mine.kv))
        for name in GROUP_ATTRS:
            if isinstance(getattr(m, name, None), int):
                setattr(m, name, mine.group)

    return step, None


def _joined(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges with each one that starts where the last ended joined to it."""
    out = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _mlp(m: nn.Module, n: int, rank: int):
    """The cut of a dense MLP, or None where `m` is none."""
    if is_linear(getattr(m, "gate_up_proj", None)) and is_linear(getattr(m, "down_proj", None)):
        width, unit = in_width(m.down_proj)
        a, b = spans(even(width, n, unit))[rank]
        fused, down = m.gate_up_proj, m.down_proj

        # gate's rows, then up's: the forward splits the output in halves
        def step(group, all_sum):
            m.gate_up_proj = rows(fused, [(a, b), (width + a, width + b)], group)
            m.down_proj = columns(down, a, b, group, all_sum)

        return step
    for names in MLP_NAMES:
        parts = [getattr(m, x, None) if x else None for x in names]
        if not all(is_linear(p) for p, x in zip(parts, names) if x):
            continue
        width, unit = in_width(parts[2])
        a, b = spans(even(width, n, unit))[rank]

        def step(group, all_sum, names=names, parts=parts, a=a, b=b):
            for name, p in zip(names[:2], parts[:2]):
                if p is not None:
                    setattr(m, name, rows(p, [(a, b)], group))
            setattr(m, names[2], columns(parts[2], a, b, group, all_sum))

        return step
    return None


def _switch(b) -> bool:
    return b is not None and all(
        "Switch" in type(getattr(b, x, None)).__name__ for x in ("up_proj", "down_proj")
    )


def _expert_block(m: nn.Module) -> bool:
    return any(_switch(getattr(m, x, None)) for x in EXPERT_NAMES)


def _experts(layer: nn.Module, name: str, m: nn.Module, n: int, rank: int):
    """(the cut, None) of a mixture of experts (`layer`'s `name`): each expert's columns, and any
    shared experts', in place; the block's output summed over the ranks."""
    assert name, "a mixture of experts is a block of its layer"
    experts = next(getattr(m, x) for x in EXPERT_NAMES if _switch(getattr(m, x, None)))
    blocks = [experts] + [getattr(m, x) for x in SHARED_NAMES if getattr(m, x, None) is not None]
    plans = []
    for blk in blocks:
        down = getattr(blk, "down_proj", None)
        if down is None or not all(
            is_linear(getattr(blk, x, None)) or _switch(blk) for x in ("up_proj", "down_proj")
        ):
            return None, f"its {type(blk).__name__} is of no layout this split knows"
        width, unit = in_width(down)
        plans.append((blk, spans(even(width, n, unit))[rank]))

    def step(group, all_sum):
        for blk, (a, b) in plans:
            for part in ("gate_proj", "up_proj"):
                if hasattr(blk, part):
                    slice_rows(getattr(blk, part), [(a, b)])
            slice_columns(blk.down_proj, a, b, keep_bias=group.rank() == 0)
        # mlx-lm's own block sums where its forward knows the sum belongs (before what each rank
        # adds alike), with MLX's all_sum; another is held by one that sums its output
        if hasattr(m, "sharding_group"):
            m.sharding_group = group
        else:
            layer.update_modules(tree_unflatten([(name, SummedOutput(m, all_sum))]))

    return step, None
