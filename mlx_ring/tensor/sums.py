"""The group tensor mode's all_sums run over (NCCL's on CUDA GPUs, else the ring's own world), and
the all_sum the cut gives its layers (`summing`).

NCCL's all_sum took 0.10 ms for a (1, 4096) bf16 array on 2 x H200 where the ring backend took 0.30
(0.13 against 0.47 for (64, 4096)); NCCL has no send/recv in MLX, so the step protocol stays on the
ring and both groups live in one process (MLX keeps one of each backend).
"""

import logging
import os
from collections.abc import Callable
from functools import partial

import mlx.core as mx

from mlx_ring import settings
from mlx_ring.gpu import on_metal
from mlx_ring.ring.world import cores_each, split_address, world_backend

log = logging.getLogger(__name__)

# MLX's ring backend sums an array of `size` x 512 KiB or more in two parts at once, one per socket,
# each socket's thread spinning while it waits (mlx/distributed/ring/ring.cpp: min_send_size of 256
# KiB a rank and direction). A rank with one core runs both spinning threads on it, so there two
# smaller sums in turn beat one whole sum (docs/benchmarks.md).
RING_PART_BYTES = 2 * 262144


def nccl_env(description: list[list[str]], size: int) -> dict[str, str]:
    """What MLX's NCCL backend reads to form its group, from mlx.launch's ring description
    (per rank, the "ip:port" addresses it listens on): rank 0's first address, and the port
    after the highest ring port (so it never meets one of the ring's), as mlx.launch --backend
    nccl would set them."""
    ip = split_address(description[0][0])[0]
    port = max(split_address(a)[1] for rank in description for a in rank) + 1
    return {"NCCL_HOST_IP": ip, "NCCL_PORT": str(port), "MLX_WORLD_SIZE": str(size)}


def nccl_sums(size: int) -> bool:
    """Whether a world of `size` ranks runs tensor mode's all_sums over NCCL: CUDA GPUs and an MLX
    built with NCCL (the planner predicts with it, `sum_group` forms the group)."""
    cuda = mx.default_device() == mx.gpu and not on_metal()
    return size > 1 and cuda and mx.distributed.is_available("nccl")


def sum_group(
    world: mx.distributed.Group, description: list[list[str]] | None
) -> mx.distributed.Group:
    """NCCL's group of the same ranks on a CUDA GPU (NCCL_HOST_IP and NCCL_PORT, when set, win),
    else `world`. `description`: `world.ring_description()`. Every rank of the world calls this
    at the same point of its start."""
    if not nccl_sums(world.size()) or not description:
        if in_pieces(world):
            log.info(
                "tensor mode's all_sums in pieces under %d KiB: this rank has one core, on which "
                "MLX's ring would sum larger arrays in two parts at once",
                world.size() * RING_PART_BYTES >> 10,
            )
        return world
    env = nccl_env(description, world.size())
    env |= {k: settings.text(k) for k in ("NCCL_HOST_IP", "NCCL_PORT") if settings.text(k)}
    os.environ.update(env)  # MLX's NCCL backend reads them when the group forms
    try:
        group = mx.distributed.init(backend="nccl", strict=True)
    except RuntimeError as e:
        raise RuntimeError(
            f"rank {world.rank()} could not join NCCL's group at {env['NCCL_HOST_IP']}:"
            f"{env['NCCL_PORT']} for tensor mode's all_sums: {e}"
        ) from e
    if (group.rank(), group.size()) != (world.rank(), world.size()):
        raise RuntimeError(
            (
                f"NCCL made rank {group.rank()} of {group.size()} of ring rank "
                f"{world.rank()} of {world.size()}"
            )
        )
    log.info("tensor mode's all_sums over NCCL (%s:%s)", env["NCCL_HOST_IP"], env["NCCL_PORT"])
    return group


def in_pieces(group: mx.distributed.Group) -> bool:
    """Whether tensor mode's all_sums over `group` go in row `pieces`: a group of the ring's world,
    on a rank with one core, where MLX's ring would sum larger arrays in two parts at once."""
    size = group.size()
    return size > 1 and not nccl_sums(size) and world_backend() == "ring" and cores_each() < 2


def summing(group: mx.distributed.Group) -> Callable[[mx.array], mx.array]:
    """The all_sum over `group` the cut gives its layers (an array in, the ranks' sum out):
    `sum_in_pieces` where `in_pieces`, else MLX's own."""
    return partial(sum_in_pieces if in_pieces(group) else mx.distributed.all_sum, group=group)


def pieces(size: int, rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """Row ranges [a, b) covering `rows` rows of `row_bytes` each, every range (of more than one
    row) under the bytes MLX's ring backend sums in two parts at once over `size` ranks."""
    step = max(1, (size * RING_PART_BYTES - 1) // row_bytes)
    return [(a, min(rows, a + step)) for a in range(0, rows, step)]


def sum_in_pieces(
    x: mx.array, *, group: mx.distributed.Group | None = None, stream=None
) -> mx.array:
    """`mx.distributed.all_sum`, an array its ring backend would sum in two parts at once summed as
    row `pieces` it sums in one: the same sums, elementwise."""
    size = (group or mx.distributed.init()).size()
    if x.ndim < 2 or x.nbytes < size * RING_PART_BYTES:
        return mx.distributed.all_sum(x, group=group, stream=stream)
    rows = x.reshape(-1, x.shape[-1])  # (rows, width)
    parts = [
        mx.distributed.all_sum(rows[a:b], group=group, stream=stream)
        for a, b in pieces(size, rows.shape[0], x.shape[-1] * x.itemsize)
    ]
    return mx.concatenate(parts).reshape(x.shape)
