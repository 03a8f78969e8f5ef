"""The heterogeneous planner's strategies: property tests of every one on generated rings
(contiguous cover within memory, `balanced` never slower than `uniform` or `memory` and optimal
against every split of small cases), and the cases they must meet (ranks sharing a machine, a
studio beside a mini, a plan that cannot fit, custom layers): pure, no MLX."""

from dataclasses import replace
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planshapes import LLAMA_8B

from mlx_ring.planning.capabilities import Capabilities, colocate, with_host_keys
from mlx_ring.planning.cost import (
    bottleneck,
    kv_room,
    layer_kv_bytes,
    max_layers,
    memory_need,
    per_layer_bytes,
    runtime_bytes,
)
from mlx_ring.planning.plan import GIB, ModelSpec, proportional_sizes
from mlx_ring.planning.report import summary
from mlx_ring.planning.strategies import STRATEGIES, plan_layers

SMALL = settings(max_examples=200, deadline=None)


@st.composite
def clusters(draw, max_ranks=6, max_layers=64):
    """A model and a ring of ranks on 1..n machines (ranks of one
    machine share its capabilities)."""
    n_layers = draw(st.integers(1, max_layers))
    layer = draw(st.floats(1e6, 2e9))
    model = ModelSpec(
        n_layers,
        layer,
        draw(st.floats(0, 3e9)),
        draw(st.floats(0, 2e9)),
        draw(st.floats(0, 2e5)),
        layer * draw(st.floats(0.05, 1)),
        draw(st.floats(1e6, 1e11)),
        draw(st.floats(0, 1e10)),
        act_bytes_per_token=draw(st.floats(0, 5e5)),
        heads=draw(st.integers(0, 64)),
        vocab=draw(st.integers(0, 262144)),
        prefill_chunk=draw(st.sampled_from([0, 16, 128, 512])),
        max_active=draw(st.integers(1, 128)),
    )
    n_hosts = draw(st.integers(1, max_ranks))
    machines = [
        Capabilities(
            f"h{i}",
            m,
            m * draw(st.floats(0.05, 1)),
            draw(st.floats(0.05, 100)),
            draw(st.floats(5, 1000)),
            working_set_gb=draw(st.sampled_from([0.0, m])),
        )
        for i, m in enumerate(draw(st.lists(st.floats(1, 512), min_size=n_hosts, max_size=n_hosts)))
    ]
    ranks = draw(st.lists(st.integers(0, n_hosts - 1), min_size=1, max_size=max_ranks))
    return model, colocate([machines[h] for h in ranks]), draw(st.integers(0, 32768))


def _try(model, caps, strategy, kv):
    try:
        return plan_layers(model, caps, strategy, kv)
    except ValueError:
        return None


@SMALL
@given(clusters())
def test_every_strategy_gives_contiguous_cover_within_memory(c):
    model, caps, kv = c
    for strategy in ("balanced", "uniform", "memory", "compute"):
        plan = _try(model, caps, strategy, kv)
        if plan is None:
            continue
        assert plan.size == len(caps) and plan.strategy == strategy
        assert [x for r in range(plan.size) for x in plan.layers_of(r)] == list(
            range(model.n_layers)
        )
        for r, (cap, n) in enumerate(zip(caps, plan.sizes)):
            assert n >= 1 and memory_need(model, cap, r, n, kv) <= cap.usable_gb * GIB + 1
        assert plan_layers(model, caps, strategy, kv) == plan  # deterministic
        # what the ring admits: the plan's reserve at least, and it fits
        room = kv_room(model, caps, plan, kv)
        assert room >= kv or layer_kv_bytes(model, room + 1) == layer_kv_bytes(model, kv)
        for r, (cap, n) in enumerate(zip(caps, plan.sizes)):
            fixed = runtime_bytes(model, cap, r, n, kv) + (model.ends_bytes if r == 0 else 0)
            assert fixed + n * per_layer_bytes(model, room) <= cap.usable_gb * GIB + 1


@SMALL
@given(clusters())
def test_balanced_is_never_slower_than_uniform_or_memory_and_fits_when_they_do(c):
    model, caps, kv = c
    balanced = _try(model, caps, "balanced", kv)
    for other in ("uniform", "memory"):
        plan = _try(model, caps, other, kv)
        if plan is not None:
            assert balanced is not None, f"{other} fits but balanced does not"
            assert bottleneck(model, caps, balanced.sizes) <= bottleneck(
                model, caps, plan.sizes
            ) * (1 + 1e-9)
    # balanced fails only when no split can fit
    fits = [max_layers(model, cap, r, kv) for r, cap in enumerate(caps)]
    assert (balanced is not None) == (
        model.n_layers >= len(caps) and min(fits) >= 1 and sum(fits) >= model.n_layers
    )


@SMALL
@given(clusters(max_ranks=3, max_layers=10))
def test_balanced_is_optimal_against_every_split(c):
    model, caps, kv = c
    balanced = _try(model, caps, "balanced", kv)
    best = None
    for sizes in product(range(1, model.n_layers + 1), repeat=len(caps)):
        if sum(sizes) == model.n_layers and all(
            memory_need(model, cap, r, n, kv) <= cap.usable_gb * GIB + 1
            for r, (cap, n) in enumerate(zip(caps, sizes))
        ):
            t = bottleneck(model, caps, list(sizes))
            best = t if best is None else min(best, t)
    assert (balanced is None) == (best is None)
    if best is not None:
        assert bottleneck(model, caps, balanced.sizes) <= best * (1 + 1e-9)


@SMALL
@given(st.integers(1, 200), st.lists(st.floats(0, 1e6), min_size=1, max_size=12))
def test_proportional_sizes_cover_and_stay_near_quota(n_layers, weights):
    if n_layers < len(weights):
        return
    sizes = proportional_sizes(n_layers, weights)
    assert sum(sizes) == n_layers and min(sizes) >= 1
    if sum(weights) > 0 and n_layers >= 2 * len(weights):
        quota = [n_layers * w / sum(weights) for w in weights]
        assert all(abs(s - q) < len(weights) + 1 for s, q in zip(sizes, quota))


def test_ranks_on_one_machine_split_evenly_and_share_its_memory():
    caps = colocate([Capabilities("box", 64, 48, 0.05, 5)] * 2)
    assert [c.usable_gb for c in caps] == [24, 24]
    # same machine: nothing to gain
    assert plan_layers(LLAMA_8B, caps, "balanced", 0).sizes == [16, 16]


def test_ranks_with_cores_of_their_own_balance_like_machines_of_their_own():
    # Rank 0 also runs the head: pinned apart, it takes fewer layers than the other,
    # as a machine would.
    one = Capabilities("box", 64, 48, 0.05, 5)
    shared = colocate([one, one])
    apart = colocate([replace(one, unit="cores 0"), replace(one, unit="cores 1")])
    machines = [replace(one, host="a"), replace(one, host="b")]
    assert plan_layers(LLAMA_8B, shared, "balanced", 0).sizes == [16, 16]
    sizes = plan_layers(LLAMA_8B, apart, "balanced", 0).sizes
    assert sizes[0] < sizes[1] and sizes == plan_layers(LLAMA_8B, machines, "balanced", 0).sizes
    assert [c.usable_gb for c in apart] == [24, 24]  # they still share the machine's memory


def test_studio_takes_more_than_a_mini():
    caps = [Capabilities("studio", 48, 36, 30, 546), Capabilities("mini", 16, 16 * 2 / 3, 4, 120)]
    sizes = plan_layers(LLAMA_8B, caps, "balanced", 8192).sizes
    assert sizes[0] > sizes[1] >= 1
    assert bottleneck(LLAMA_8B, caps, sizes) < bottleneck(LLAMA_8B, caps, [16, 16])


def test_infeasible_plan_names_host_need_and_remedy():
    minis = [Capabilities(f"mini-{i}", 16, 16 * 2 / 3, 4, 120) for i in range(1, 3)]
    huge = ModelSpec(48, 1.1e9, 3e9, 1.5e9, 8192, 1.1e9, 2.2e9, 3e9)
    with pytest.raises(
        ValueError,
        match=r"mini-1 \(rank 0\) holds at most .*Add a host, pick a smaller or more quantized",
    ):
        plan_layers(huge, minis, "balanced", 8192)
    with pytest.raises(
        ValueError,
        match=(
            r"host mini-1 \(rank 0\) cannot hold its slice: layers \[0, 24\) need "
            r".* GB .* but it has "
            r"10.7 GB usable.*no split fits"
        ),
    ):
        plan_layers(huge, minis, "uniform", 8192)


def test_custom_layers_and_weights_from_hosts_json():
    base = [Capabilities(h, 64, 48, 10, 400) for h in ("a", "b", "c")]
    caps = [with_host_keys(base[0], {"layers": 4}), with_host_keys(base[1], {"weight": 3}), base[2]]
    assert plan_layers(LLAMA_8B, caps, "custom", 0).sizes == [4, 21, 7]
    with pytest.raises(ValueError, match="add up"):
        plan_layers(LLAMA_8B, [with_host_keys(c, {"layers": 5}) for c in base], "custom", 0)
    # LAYERS= wins over any strategy, and the memory check still applies
    assert plan_layers(LLAMA_8B, base, "balanced", 0, sizes=[30, 1, 1]).sizes == [30, 1, 1]


def test_summary_predicts_stage_times_and_tokens_per_second():
    caps = [Capabilities("a", 64, 48, 100, 400), Capabilities("b", 64, 48, 100, 100)]
    s = summary(LLAMA_8B, caps, plan_layers(LLAMA_8B, caps, "uniform", 0), 0)
    a, b = (r["predicted_stage_ms"] for r in s["ranks"])
    assert b == pytest.approx(16 * 436e6 / 100e9 * 1e3, rel=1e-3)  # bandwidth-bound: bytes / (GB/s)
    assert a == pytest.approx((16 * 436e6 + 1.05e9) / 400e9 * 1e3, rel=1e-3)  # + the head on rank 0
    assert s["predicted_tokens_per_s"] == pytest.approx(1e3 / (a + b), rel=1e-2)
    assert set(STRATEGIES) == {"balanced", "uniform", "memory", "compute", "custom"}
