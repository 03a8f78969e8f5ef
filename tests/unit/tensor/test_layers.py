"""The layers tensor mode's cut puts in a model sum with the all_sum they are given, and the model's
own forward runs through them unchanged: on a world of one (where every sum is its input), each
sum is counted and the logits are the whole model's. The cut across real ranks:
tests/ring/test_tensor_matrix.py."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.nn.layers.distributed import QuantizedShardedToAllLinear, ShardedToAllLinear
from mlx.utils import tree_flatten
from model_zoo import build, tiny_config

from mlx_ring.tensor import sums
from mlx_ring.tensor.layers import SummedOutput, columns, sum_with

PROMPT = mx.array([[5, 17, 42, 99, 3]])


class Counted:
    """A world of one's all_sum (the array itself), counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x: mx.array) -> mx.array:
        self.calls += 1
        return x


def leaves(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)]


@pytest.mark.parametrize("bits", [0, 4])
def test_mlx_lms_shard_layers_sum_with_the_function_given(bits):
    model = build(tiny_config("llama"))
    if bits:
        nn.quantize(model, group_size=32, bits=bits)
    want = model(PROMPT)
    model.shard(mx.distributed.init())  # mlx-lm's own shard(), on a world of one
    all_sum = Counted()
    sum_with(model, all_sum)
    got = model(PROMPT)
    # attention's output projection and the MLP's down projection, in every layer
    assert all_sum.calls == 2 * len(model.layers)
    assert not [
        m for m in leaves(model) if type(m) in (ShardedToAllLinear, QuantizedShardedToAllLinear)
    ]
    assert mx.allclose(got, want, atol=1e-5).item()


def test_a_rank_s_columns_sum_with_the_function_given():
    layer = nn.Linear(64, 16)
    x = mx.random.normal((3, 64))
    want = layer(x)
    all_sum = Counted()
    mine = columns(layer, 0, 64, mx.distributed.init(), all_sum)
    assert mx.allclose(mine(x), want, atol=1e-6).item() and all_sum.calls == 1


def test_a_mixture_of_experts_held_sums_its_output_and_runs_its_own_forward():
    model = build(tiny_config("mixtral"))
    want = model(PROMPT)
    all_sum = Counted()
    for layer in model.layers:
        layer.block_sparse_moe = SummedOutput(layer.block_sparse_moe, all_sum)
    assert mx.allclose(model(PROMPT), want, atol=1e-6).item()
    assert all_sum.calls == len(model.layers)


def test_the_sums_leave_mlxs_all_sum_as_it_is(monkeypatch):
    mlx_sum = mx.distributed.all_sum
    world = mx.distributed.init()  # a world of one: MLX's own sum
    assert sums.sum_group(world, [["127.0.0.1:5000"]]) is world
    assert mx.distributed.all_sum is mlx_sum
    assert sums.summing(world).func is mlx_sum

    class Ranks:  # two ranks of the ring's world
        def size(self):
            return 2

    # a rank of one core on MLX's ring: its layers sum in pieces, MLX's all_sum untouched
    monkeypatch.setattr(sums, "world_backend", lambda: "ring")
    monkeypatch.setattr(sums, "cores_each", lambda: 1)
    assert sums.in_pieces(Ranks()) and sums.summing(Ranks()).func is sums.sum_in_pieces
    monkeypatch.setattr(sums, "cores_each", lambda: 2)
    assert not sums.in_pieces(Ranks()) and sums.summing(Ranks()).func is mlx_sum
    assert mx.distributed.all_sum is mlx_sum
