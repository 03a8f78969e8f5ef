"""The layers a tensor-mode cut puts in a model: MLX's distributed linear layers holding a rank's
rows or columns of a linear layer (quantized or not, in any ranges, so uneven splits too), an
RMSNorm over a width the ranks share, and a block whose output is summed over the ranks.
"""

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)


def is_linear(m) -> bool:
    return isinstance(m, (nn.Linear, nn.QuantizedLinear))


def in_width(layer: nn.Module) -> tuple[int, int]:
    """A linear (or switch) layer's input width and the unit it can be cut in
    (its quantization group)."""
    if hasattr(layer, "bits"):
        return layer.weight.shape[-1] * 32 // layer.bits, layer.group_size
    return layer.weight.shape[-1], 1


def out_width(layer: nn.Module) -> int:
    return layer.weight.shape[-2]


def slice_rows(layer: nn.Module, ranges: list[tuple[int, int]]) -> None:
    """Keep output rows `ranges` (in order) of a linear or switch layer's parameters, in place."""

    def cut(k, v):
        axis = -1 if k == "bias" else -2
        parts = [v[..., a:b] if axis == -1 else v[..., a:b, :] for a, b in ranges]
        return mx.contiguous(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=axis))

    layer.update({k: cut(k, v) for k, v in layer.parameters().items() if isinstance(v, mx.array)})


def slice_columns(layer: nn.Module, a: int, b: int, keep_bias: bool = True) -> None:
    """Keep input columns [a, b) of a linear or switch layer's parameters, in place; without
    `keep_bias` its bias becomes 0 (the rank's output is summed with the others', which add it)."""
    p = layer.parameters()
    pack = 32 // layer.bits if hasattr(layer, "bits") else 1  # input columns per stored column
    gs = getattr(layer, "group_size", 1)
    new = {"weight": mx.contiguous(p["weight"][..., a // pack : b // pack])}
    for k in ("scales", "biases"):
        if isinstance(p.get(k), mx.array):
            new[k] = mx.contiguous(p[k][..., a // gs : b // gs])
    if "bias" in p and not keep_bias:
        new["bias"] = mx.zeros_like(p["bias"])
    layer.update(new)


def rows(layer, ranges: list[tuple[int, int]], group: mx.distributed.Group) -> nn.Module:
    """An all-to-sharded layer holding output rows `ranges` of `layer`."""
    n, bias, width = group.size(), "bias" in layer, sum(b - a for a, b in ranges)
    # Built for width * n outputs, so MLX's even-split check passes; its parameters
    # are this rank's below.
    if isinstance(layer, nn.QuantizedLinear):
        out = QuantizedAllToShardedLinear(
            in_width(layer)[0],
            width * n,
            bias,
            layer.group_size,
            layer.bits,
            getattr(layer, "mode", "affine"),
            group=group,
        )
    else:
        out = AllToShardedLinear(layer.weight.shape[1], width * n, bias, group=group)
    slice_rows(layer, ranges)
    out.update({k: v for k, v in layer.parameters().items() if isinstance(v, mx.array)})
    return out


def columns(layer, a: int, b: int, group: mx.distributed.Group) -> nn.Module:
    """A sharded-to-all layer holding input columns [a, b) of `layer`; it all_sums,
    then adds the bias."""
    n, bias = group.size(), "bias" in layer
    if isinstance(layer, nn.QuantizedLinear):
        out = QuantizedShardedToAllLinear(
            (b - a) * n,
            out_width(layer),
            bias,
            layer.group_size,
            layer.bits,
            getattr(layer, "mode", "affine"),
            group=group,
        )
    else:
        out = ShardedToAllLinear((b - a) * n, out_width(layer), bias, group=group)
    slice_columns(layer, a, b)
    out.update({k: v for k, v in layer.parameters().items() if isinstance(v, mx.array)})
    return out


class SplitRMSNorm(nn.Module):
    """An RMSNorm over a width the ranks share (OLMo 2's norm over every head's queries): each rank
    holds its part of the weight, and the sum of squares is all_summed."""

    def __init__(self, weight: mx.array, eps: float, width: int, group: mx.distributed.Group):
        super().__init__()
        self.weight, self.eps, self.width, self.group = weight, eps, width, group

    def __call__(self, x: mx.array) -> mx.array:
        square = mx.sum(mx.square(x.astype(mx.float32)), axis=-1, keepdims=True)
        mean = mx.distributed.all_sum(square, group=self.group) / self.width
        return (x.astype(mx.float32) * mx.rsqrt(mean + self.eps)).astype(x.dtype) * self.weight


_SUMMED: dict[type, type] = {}


def sum_output(block: nn.Module, group: mx.distributed.Group) -> None:
    """Make `block` (a mixture of experts whose experts hold this rank's columns) all_sum its
    output, as mlx-lm's own blocks do when shard() sets their `sharding_group`. Its class becomes
    a subclass that adds the sum, so its parameters keep their names."""
    cls = type(block)
    if cls not in _SUMMED:

        def __call__(self, *args, **kwargs):
            return mx.distributed.all_sum(
                cls.__call__(self, *args, **kwargs), group=self.summed_over
            )

        _SUMMED[cls] = type(f"Summed{cls.__name__}", (cls,), {"__call__": __call__})
    block.__class__ = _SUMMED[cls]
    block.summed_over = group
