"""Tensor mode's NCCL group: where it forms, from mlx.launch's ring description; and its sums on a
rank of one core, in pieces MLX's ring sums in one part."""

import mlx.core as mx

from mlx_ring.ring.world import ring_description
from mlx_ring.tensor.sums import (
    RING_PART_BYTES,
    nccl_env,
    nccl_sums,
    pieces,
    sum_group,
    sum_in_pieces,
)


def test_nccl_forms_at_rank_0s_ring_address_on_a_port_past_every_ring_port():
    description = [["10.0.0.1:32323", "10.0.1.1:32324"], ["10.0.0.2:32323"], ["10.0.0.1:32325"]]
    assert nccl_env(description, 3) == {
        "NCCL_HOST_IP": "10.0.0.1",
        "NCCL_PORT": "32326",
        "MLX_WORLD_SIZE": "3",
    }


def test_an_ipv6_rank_0_is_given_without_brackets():
    assert nccl_env([["[fe80::1]:40000"], ["[fe80::2]:40000"]], 2)["NCCL_HOST_IP"] == "fe80::1"


def test_off_cuda_the_sums_stay_on_the_ring():
    world = mx.distributed.init()  # a world of one here, on a CPU
    assert sum_group(world, [["127.0.0.1:5000"]]) is world
    assert not nccl_sums(2) and not nccl_sums(1)  # so the planner predicts the ring's all_sum


def test_the_description_is_read_before_the_rank_drops_mlx_launchs_hostfile(tmp_path, monkeypatch):
    from mlx_ring.ring.leftovers import drop_hostfile

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[["10.0.0.1:32323"], ["10.0.0.2:32323"]]')
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    description = ring_description()
    drop_hostfile()  # as server.main does once MLX has read it
    assert not hostfile.exists() and nccl_env(description, 2)["NCCL_PORT"] == "32324"
    monkeypatch.delenv("MLX_HOSTFILE")
    assert ring_description() is None


def test_pieces_cover_every_row_each_under_what_mlx_sums_in_two_parts():
    # A 512-token prefill chunk of a 576-wide float32 hidden state over 2 ranks:
    # 1.18 MB, two pieces.
    assert pieces(2, 512, 576 * 4) == [(0, 455), (455, 512)]
    assert all((b - a) * 576 * 4 < 2 * RING_PART_BYTES for a, b in pieces(2, 512, 576 * 4))
    got = pieces(3, 1000, 8192 * 2)
    assert (
        got[0] == (0, 95) and got[-1][1] == 1000 and all(p[1] == q[0] for p, q in zip(got, got[1:]))
    )
    # a row too wide still goes whole
    assert pieces(2, 3, 4 * RING_PART_BYTES) == [(0, 1), (1, 2), (2, 3)]


def test_summed_in_pieces_an_array_keeps_its_values_and_shape():
    world = mx.distributed.init()  # a world of one: each piece's sum is the piece
    big = mx.random.normal((2, 600, 1024))  # 4.9 MB: pieces
    small = mx.random.normal((1, 4, 576))
    for x in (big, small, mx.random.normal((300_000,))):
        out = sum_in_pieces(x, group=world)
        assert out.shape == x.shape and mx.array_equal(out, mx.distributed.all_sum(x, group=world))
