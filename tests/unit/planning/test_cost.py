"""What a plan costs: the hops between stages, and the KV room each rank has beside its slice and
keeps after what it used beyond the plan: pure, no MLX."""

from dataclasses import replace

import pytest
from planshapes import LLAMA_8B

from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import hop_seconds, kv_room, layer_kv_bytes, room_after, runtime_bytes
from mlx_ring.planning.plan import GIB, ModelSpec, plan_from_sizes
from mlx_ring.planning.report import summary
from mlx_ring.planning.strategies import plan_layers


def test_hops_add_bytes_over_bandwidth_and_half_a_round_trip_each():
    spec = ModelSpec(
        32, 436e6, 2 * 1.05e9, 1.05e9, 4096, 436e6, 2 * 218e6, 2 * 525e6, "bfloat16", "8b", 4096 * 2
    )
    hop = 4096 * 2 * 8 / 1e9 + 0.2e-3 / 2  # 8 KiB on 1 Gbit/s, half of a 0.2 ms round trip
    assert hop_seconds(spec, [(0.2, 1.0)] * 3) == pytest.approx(3 * hop)
    assert hop_seconds(spec, [(0.2, 1.0)], tokens=4096) == pytest.approx(
        4096 * 4096 * 2 * 8 / 1e9 + 1e-4
    )
    caps = [Capabilities("studio", 48, 36, 30, 546), Capabilities("mini", 16, 16 * 2 / 3, 4, 120)]
    plan = plan_layers(spec, caps, "uniform", 0)
    plain, hopped = summary(spec, caps, plan, 0), summary(spec, caps, plan, 0, [(0.2, 1.0)] * 2)
    assert plain["hops_ms"] is None and hopped["hops_ms"] == pytest.approx(2e3 * hop, abs=1e-3)
    assert 1 / hopped["predicted_tokens_per_s"] == pytest.approx(
        1 / plain["predicted_tokens_per_s"] + 2 * hop, rel=1e-3
    )


def test_the_kv_room_shrinks_by_what_a_rank_used_beyond_the_plan():
    room, per_token = 10_000, 16 * layer_kv_bytes(LLAMA_8B, 1)  # 16 layers' caches, one token
    assert room_after(LLAMA_8B, room, [16, 16], [0.0, 0.0]) == room
    assert room_after(LLAMA_8B, room, [16, 16], [0.0, 299.5 * per_token]) == room - 300
    # the tightest
    assert room_after(LLAMA_8B, room, [16, 16], [99.5 * per_token, 299.5 * per_token]) == room - 300
    assert room_after(LLAMA_8B, room, [16, 16], [0.0, (room + 5) * per_token]) == 0
    # a rank without layers holds no cache
    assert room_after(LLAMA_8B, room, [32, 0], [0.0, 1e12]) == room


def test_kv_room_is_what_the_tightest_rank_holds_beside_its_slice():
    caps = [Capabilities("studio", 48, 36, 30, 546), Capabilities("mini", 16, 16 * 2 / 3, 4, 120)]
    plan = plan_from_sizes(32, [24, 8])
    per_token = LLAMA_8B.kv_bytes_per_token  # one layer's
    studio = (
        36 * GIB
        - runtime_bytes(LLAMA_8B, caps[0], 0, 24, 8192)
        - LLAMA_8B.ends_bytes
        - 24 * LLAMA_8B.layer_bytes
    ) // (24 * per_token)
    mini = (
        16 * 2 / 3 * GIB - runtime_bytes(LLAMA_8B, caps[1], 1, 8, 8192) - 8 * LLAMA_8B.layer_bytes
    ) // (8 * per_token)
    assert kv_room(LLAMA_8B, caps, plan, 8192) == min(studio, mini) == mini
    assert summary(LLAMA_8B, caps, plan, 8192)["kv_capacity_tokens"] == mini
    # every cache stops at its window
    windowed = replace(LLAMA_8B, kv_window_share=1.0, kv_window=4096)
    assert kv_room(windowed, caps, plan, 8192, most=10**6) == 10**6
