"""The cost model: a rank's predicted time per decoded token (its layers, rank 0's head, the hops
between ranks) and the memory its slice needs (weights, KV cache, runtime), and the KV room a plan
leaves. Pure, no MLX; memory in GiB (2**30 bytes), bandwidth in 10**9 bytes/s.
"""

import math

from mlx_ring.planning.activations import activation_bytes
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.plan import GIB, LayerPlan, ModelSpec


def layer_seconds(model: ModelSpec, cap: Capabilities) -> float:
    """Predicted time of one layer for one decoded token: read its weights, or do its math."""
    return max(
        model.layer_read_bytes / (cap.bandwidth_gbs * 1e9), model.layer_flops / (cap.tflops * 1e12)
    )


def fixed_seconds(model: ModelSpec, cap: Capabilities, rank: int) -> float:
    """Rank 0 also runs the head for every decoded token."""
    if rank != 0:
        return 0.0
    return max(
        model.head_read_bytes / (cap.bandwidth_gbs * 1e9), model.head_flops / (cap.tflops * 1e12)
    )


def stage_seconds(model: ModelSpec, caps: list[Capabilities], sizes: list[int]) -> list[float]:
    return [
        fixed_seconds(model, c, r) + n * layer_seconds(model, c)
        for r, (c, n) in enumerate(zip(caps, sizes))
    ]


def host_seconds(
    model: ModelSpec, caps: list[Capabilities], sizes: list[int]
) -> dict[tuple[str, str], float]:
    """Ranks on one machine take turns on its cores, so a machine is busy for the sum of its stages;
    a rank with a GPU or cores to itself (its `unit`) is busy only for its own."""
    busy: dict[tuple[str, str], float] = {}
    for c, t in zip(caps, stage_seconds(model, caps, sizes)):
        busy[c.host, c.unit] = busy.get((c.host, c.unit), 0.0) + t
    return busy


def bottleneck(model: ModelSpec, caps: list[Capabilities], sizes: list[int]) -> float:
    """The slowest stage (the busiest machine): it bounds decode throughput with
    the ring kept full."""
    return max(host_seconds(model, caps, sizes).values())


def runtime_bytes(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    """Memory a rank with `n` layers needs beside weights and caches: its activations as
    estimated (`activation_bytes`, the prefill work the scheduler lets it hold at once,
    against `kv_tokens` keys). The warm-up measures them, and what it finds beyond this comes
    out of the KV room."""
    return activation_bytes(model, cap, rank, n, kv_tokens)


def fixed_bytes(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    return runtime_bytes(model, cap, rank, n, kv_tokens) + (model.ends_bytes if rank == 0 else 0.0)


def layer_kv_bytes(model: ModelSpec, kv_tokens: int) -> float:
    """Cache bytes one layer (the mean over the layers) reserves for `kv_tokens` tokens: all of
    them in a full-attention layer, at most its window in a sliding-window layer, its fixed state
    in a recurrent one."""
    full = 1.0 - model.kv_window_share - model.state_share
    tokens = full * kv_tokens + model.kv_window_share * min(model.kv_window, kv_tokens)
    return tokens * model.kv_bytes_per_token + model.state_share * model.state_bytes


def per_layer_bytes(model: ModelSpec, kv_tokens: int) -> float:
    return model.layer_bytes + layer_kv_bytes(model, kv_tokens)


def memory_need(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    """Bytes rank `rank` needs for `n` layers: weights, KV reserve, runtime, and on
    rank 0 the ends."""
    return fixed_bytes(model, cap, rank, n, kv_tokens) + n * per_layer_bytes(model, kv_tokens)


def kv_room(
    model: ModelSpec, caps: list[Capabilities], plan: LayerPlan, kv_tokens: int, most: int = 1 << 24
) -> int:
    """Tokens of KV cache every rank can hold beside its slice (weights, runtime for a context of
    `kv_tokens` and, on rank 0, the ends): the room the ring has for the caches of the requests it
    serves at once. A plan that fits gives at least its KV_TOKENS; `most` caps it (caches that stop
    growing: windows, states)."""
    tokens = most
    for r, (c, (s, e)) in enumerate(zip(caps, plan.ranges)):
        room = (
            c.usable_gb * GIB
            - fixed_bytes(model, c, r, e - s, kv_tokens)
            - (e - s) * model.layer_bytes
        )
        lo, hi = 0, tokens
        while lo < hi:  # the most tokens whose caches fit in `room`
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if (e - s) * layer_kv_bytes(model, mid) <= room else (lo, mid - 1)
        tokens = lo
    return tokens


def room_after(model: ModelSpec, kv_room: int, sizes: list[int], excess: list[float]) -> int:
    """`kv_room` (KV tokens every rank has room for, `kv_room()`) once each rank's `excess` bytes
    come out of its share: memory measured in use beyond what the plan counts. Rank r holds the
    caches of `sizes[r]` layers."""
    tokens = kv_room
    for n, x in zip(sizes, excess):
        if x <= 0 or n == 0:
            continue
        left = n * layer_kv_bytes(model, kv_room) - x
        lo, hi = 0, tokens
        while lo < hi:  # the most tokens whose caches fit in what is left of this rank's room
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if n * layer_kv_bytes(model, mid) <= left else (lo, mid - 1)
        tokens = lo
    return tokens


def max_layers(model: ModelSpec, cap: Capabilities, rank: int, kv_tokens: int) -> int:
    """The most layers `cap` holds; its activations grow with its layers where it holds them all."""
    room = cap.usable_gb * GIB - fixed_bytes(model, cap, rank, 0, kv_tokens)
    most = min(model.n_layers, max(0, math.floor(room / per_layer_bytes(model, kv_tokens) + 1e-9)))
    while most and memory_need(model, cap, rank, most, kv_tokens) > cap.usable_gb * GIB + 1:
        most -= 1
    return most


def hop_seconds(model: ModelSpec, links: list[tuple[float, float]], tokens: int = 1) -> float:
    """Time one step of `tokens` tokens spends between ranks: on each hop (rtt ms, Gbit/s), the
    hidden states' bytes over the link's bandwidth plus half its round trip."""
    return sum(
        tokens * model.hidden_bytes * 8 / (gbit * 1e9) + rtt_ms / 2e3 for rtt_ms, gbit in links
    )
