"""Tensor mode's NCCL group: where it forms, from mlx.launch's ring description."""

import mlx.core as mx

from mlx_ring.ring.sums import nccl_env, nccl_sums, sum_group
from mlx_ring.ring.world import ring_description


def test_nccl_forms_at_rank_0s_ring_address_on_a_port_past_every_ring_port():
    description = [["10.0.0.1:32323", "10.0.1.1:32324"], ["10.0.0.2:32323"], ["10.0.0.1:32325"]]
    assert nccl_env(description, 3) == {"NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "32326", "MLX_WORLD_SIZE": "3"}


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
