"""The layers a tensor-mode cut puts in a model: MLX's distributed linear layers holding a rank's
rows or columns of a linear layer (quantized or not, in any ranges, so uneven splits too), an
RMSNorm over a width the ranks share, and a block whose output is summed over the ranks. Every one
that sums calls the all_sum it is given (`sums.summing`), never MLX's by its global name.
"""

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import (
    AllToShardedLinear,
    QuantizedAllToShardedLinear,
    QuantizedShardedToAllLinear,
    ShardedToAllLinear,
)
from mlx.utils import tree_flatten, tree_unflatten

# An all_sum over the ranks that share the layers: an array in, the ranks' sum of it out.
Sum = Callable[[mx.array], mx.array]


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


def columns(layer, a: int, b: int, group: mx.distributed.Group, all_sum: Sum) -> nn.Module:
    """A sharded-to-all layer holding input columns [a, b) of `layer`; it sums with `all_sum`,
    then adds the bias."""
    slice_columns(layer, a, b)
    return summed(layer, b - a, group, all_sum)


def summed(layer, width: int, group: mx.distributed.Group, all_sum: Sum) -> nn.Module:
    """A sharded-to-all layer of `layer`'s parameters, this rank's `width` input columns of each
    output, summing with `all_sum`."""
    n, bias = group.size(), "bias" in layer
    if hasattr(layer, "bits"):
        out = QuantizedSummedLinear(
            width * n,
            out_width(layer),
            bias,
            layer.group_size,
            layer.bits,
            getattr(layer, "mode", "affine"),
            group=group,
            all_sum=all_sum,
        )
    else:
        out = SummedLinear(width * n, out_width(layer), bias, group=group, all_sum=all_sum)
    out.update({k: v for k, v in layer.parameters().items() if isinstance(v, mx.array)})
    return out


def sum_with(model: nn.Module, all_sum: Sum) -> None:
    """Every sharded-to-all layer of MLX's that mlx-lm's `shard()` put in `model` replaced by ours
    of the same parameters, which sums with `all_sum`; in place."""
    mlx_layers = (ShardedToAllLinear, QuantizedShardedToAllLinear)
    ours = [
        (path, summed(m, in_width(m)[0], m.group, all_sum))
        for path, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
        if type(m) in mlx_layers
    ]
    if ours:
        model.update_modules(tree_unflatten(ours))


class SummedLinear(ShardedToAllLinear):
    """MLX's sharded-to-all layer, summing with the `all_sum` it is given."""

    def __init__(self, *args, all_sum: Sum, **kwargs):
        super().__init__(*args, **kwargs)
        self.all_sum = all_sum

    def __call__(self, x: mx.array) -> mx.array:
        x = self.all_sum(x @ self["weight"].T)
        return x + self["bias"] if "bias" in self else x


class QuantizedSummedLinear(QuantizedShardedToAllLinear):
    """MLX's quantized sharded-to-all layer, summing with the `all_sum` it is given."""

    def __init__(self, *args, all_sum: Sum, **kwargs):
        super().__init__(*args, **kwargs)
        self.all_sum = all_sum

    def __call__(self, x: mx.array) -> mx.array:
        x = mx.quantized_matmul(
            x,
            self["weight"],
            scales=self["scales"],
            biases=self.get("biases"),
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )
        x = self.all_sum(x)
        return x + self["bias"] if "bias" in self else x


class SplitRMSNorm(nn.Module):
    """An RMSNorm over a width the ranks share (OLMo 2's norm over every head's queries): each rank
    holds its part of the weight, and the sum of squares is summed over the ranks."""

    def __init__(self, weight: mx.array, eps: float, width: int, all_sum: Sum):
        super().__init__()
        self.weight, self.eps, self.width, self.all_sum = weight, eps, width, all_sum

    def __call__(self, x: mx.array) -> mx.array:
        square = mx.sum(mx.square(x.astype(mx.float32)), axis=-1, keepdims=True)
        mean = self.all_sum(square) / self.width
        return (x.astype(mx.float32) * mx.rsqrt(mean + self.eps)).astype(x.dtype) * self.weight


class SummedOutput(nn.Module):
    """A block (a mixture of experts whose experts hold this rank's columns) whose output is
    summed over the ranks, as mlx-lm's own blocks sum theirs when shard() sets their
    `sharding_group`. It holds the block and calls it: the block's forward is its own."""

    def __init__(self, block: nn.Module, all_sum: Sum):
        super().__init__()
        self.block, self.all_sum = block, all_sum

    def __call__(self, *args, **kwargs):
        return self.all_sum(self.block(*args, **kwargs))
