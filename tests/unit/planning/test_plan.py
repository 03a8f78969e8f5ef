"""The layer plan is a pure function: property tests, no MLX."""

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_ring.planning.plan import LayerPlan, plan_from_sizes, uniform_plan


@given(st.integers(1, 200), st.integers(1, 16))
def test_uniform_plan_is_contiguous_disjoint_and_covers_every_layer(n_layers, n_ranks):
    if n_layers < n_ranks:
        with pytest.raises(ValueError, match="at least one layer"):
            uniform_plan(n_layers, n_ranks)
        return
    plan = uniform_plan(n_layers, n_ranks)
    covered = [layer for r in range(plan.size) for layer in plan.layers_of(r)]
    assert covered == list(range(n_layers))
    sizes = [e - s for s, e in plan.ranges]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_uniform_plan_gives_extra_layers_to_low_ranks():
    assert uniform_plan(7, 3).ranges == ((0, 3), (3, 5), (5, 7))
    assert uniform_plan(30, 2).ranges == ((0, 15), (15, 30))


def test_custom_sizes_checked():
    assert plan_from_sizes(7, [1, 4, 2]).ranges == ((0, 1), (1, 5), (5, 7))
    with pytest.raises(ValueError, match="add up"):
        plan_from_sizes(7, [1, 4, 1])
    with pytest.raises(ValueError, match="positive"):
        plan_from_sizes(7, [0, 5, 2])


def test_plan_rejects_gaps_and_overlaps():
    with pytest.raises(AssertionError):
        LayerPlan(4, ((0, 2), (3, 4)))
    with pytest.raises(AssertionError):
        LayerPlan(4, ((0, 3), (2, 4)))


def test_describe_names_hosts_and_half_open_ranges():
    text = uniform_plan(30, 2).describe(["mini-a", "mini-b"])
    assert text.splitlines() == [
        "rank 0 (mini-a): layers [0, 15)  15 layers",
        "rank 1 (mini-b): layers [15, 30)  15 layers",
    ]


# --- the heterogeneous planner ----------------------------------------------------------------

from itertools import product  # noqa: E402

from hypothesis import settings  # noqa: E402

from mlx_ring.planning.capabilities import Capabilities, colocate, set_aside, with_host_keys  # noqa: E402
from mlx_ring.planning.cost import (  # noqa: E402
    bottleneck,
    hop_seconds,
    kv_room,
    layer_kv_bytes,
    max_layers,
    memory_need,
    per_layer_bytes,
    room_after,
    runtime_bytes,
)
from mlx_ring.planning.plan import GIB, ModelSpec, proportional_sizes  # noqa: E402
from mlx_ring.planning.report import summary  # noqa: E402
from mlx_ring.planning.strategies import STRATEGIES, plan_layers  # noqa: E402

SMALL = settings(max_examples=200, deadline=None)


@st.composite
def clusters(draw, max_ranks=6, max_layers=64):
    """A model and a ring of ranks on 1..n machines (ranks of one machine share its
    capabilities)."""
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


LLAMA_8B = ModelSpec(
    32, 436e6, 2 * 1.05e9, 1.05e9, 4096, 436e6, 2 * 218e6, 2 * 525e6, "bfloat16", "8b"
)


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


def test_ranks_on_one_machine_split_evenly_and_share_its_memory():
    caps = colocate([Capabilities("box", 64, 48, 0.05, 5)] * 2)
    assert [c.usable_gb for c in caps] == [24, 24]
    # same machine: nothing to gain
    assert plan_layers(LLAMA_8B, caps, "balanced", 0).sizes == [16, 16]


def test_ranks_with_cores_of_their_own_balance_like_machines_of_their_own():
    # Rank 0 also runs the head: pinned apart, it takes fewer layers than the other, as a machine
    # would.
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


def test_max_memory_gb_caps_the_budget_and_bad_keys_are_named():
    cap = with_host_keys(Capabilities("studio", 48, 36, 30, 546), {"max_memory_gb": 20})
    assert cap.usable_gb == 20
    assert with_host_keys(cap, {"memory_gb": 16}).usable_gb == pytest.approx(16 * 2 / 3)
    with pytest.raises(ValueError, match="studio: tflops must be a positive number"):
        with_host_keys(cap, {"tflops": "fast"})


def test_summary_predicts_stage_times_and_tokens_per_second():
    caps = [Capabilities("a", 64, 48, 100, 400), Capabilities("b", 64, 48, 100, 100)]
    s = summary(LLAMA_8B, caps, plan_layers(LLAMA_8B, caps, "uniform", 0), 0)
    a, b = (r["predicted_stage_ms"] for r in s["ranks"])
    assert b == pytest.approx(16 * 436e6 / 100e9 * 1e3, rel=1e-3)  # bandwidth-bound: bytes / (GB/s)
    assert a == pytest.approx((16 * 436e6 + 1.05e9) / 400e9 * 1e3, rel=1e-3)  # + the head on rank 0
    assert s["predicted_tokens_per_s"] == pytest.approx(1e3 / (a + b), rel=1e-2)
    assert set(STRATEGIES) == {"balanced", "uniform", "memory", "compute", "custom"}


def test_dry_run_from_config_json_and_hostfile_keys(tmp_path, capsys):
    """`./launch.sh plan`: sizes from config.json alone, capabilities from hosts.json, text and
    --json."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {
                    "ssh": "studio",
                    "ips": ["10.0.0.1"],
                    "memory_gb": 48,
                    "tflops": 17,
                    "bandwidth_gbs": 480,
                },
                {
                    "ssh": "mini",
                    "ips": ["10.0.0.2"],
                    "memory_gb": 16,
                    "tflops": 3.5,
                    "bandwidth_gbs": 100,
                },
            ]
        )
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--strategy",
        "balanced",
        "--layers",
        "",
        "--kv-tokens",
        "8192",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (
        "32 layers x 0.41 GB" in text
        and "plan balanced" in text
        and "tokens/s for one stream" in text
    )
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["layers"] for r in d["ranks"]] == [[0, 26], [26, 32]] and d["other_strategies"][
        "uniform"
    ]["sizes"] == [16, 16]
    assert main([*args, "--kv-tokens", "400000"]) == 2  # 50 GB of KV cache: nothing fits
    assert "the model does not fit" in capsys.readouterr().err


def test_the_prompt_cache_is_set_aside_up_to_a_quarter_of_a_rank():
    caps, kept = set_aside(
        [Capabilities("studio", 64, 48, 30, 546), Capabilities("mini", 16, 2, 4, 120)], 1.0
    )
    assert kept == [1.0, 0.5] and [c.usable_gb for c in caps] == [47.0, 1.5]
    assert set_aside(caps, 0.0)[0] == caps


def test_plan_for_applies_host_keys_then_shares_hosts_then_sets_the_prompt_cache_aside():
    """The one assembly every caller runs: keys win, ranks on one host split it, the cache comes
    off."""
    from mlx_ring.planning.assemble import plan_for

    caps = [
        Capabilities("studio", 64, 48, 30, 546),
        Capabilities("mini", 16, 12, 4, 120),
        Capabilities("mini", 16, 12, 4, 120),
    ]
    plan, planned, kept = plan_for(
        LLAMA_8B, caps, [{"max_memory_gb": 20}, {}, {}], "balanced", 8192, prompt_cache_gb=1.0
    )
    # 12 / 2 ranks, less 1
    assert [c.usable_gb for c in planned] == [19.0, 5.0, 5.0] and kept == [1.0, 1.0, 1.0]
    assert plan.strategy == "balanced" and sum(plan.sizes) == 32
    assert plan_for(LLAMA_8B, caps, None, "balanced", 8192, layers=(20, 6, 6))[0].sizes == [
        20,
        6,
        6,
    ]
    assert (
        plan_for(LLAMA_8B, caps, None, "balanced", 8192, layers=(20, 6, 6))[0].strategy == "custom"
    )
    shipped, _, _ = plan_for(
        LLAMA_8B, caps, None, "uniform", 8192, provisioned=("balanced", [22, 5, 5])
    )
    # the launcher's plan, as it shipped it
    assert shipped.sizes == [22, 5, 5] and shipped.strategy == "balanced"
    with pytest.raises(ValueError, match="names 2 hosts but the ring has 3"):
        plan_for(LLAMA_8B, caps, [{}, {}], "balanced", 8192)
    with pytest.raises(ValueError, match="mini"):
        # 15 layers do not fit in 6 GB
        plan_for(LLAMA_8B, caps, None, "custom", 8192, layers=(2, 15, 15))


def test_dry_run_keeps_a_probed_macs_working_set(tmp_path, capsys, monkeypatch):
    """A host probed here is planned as the ring would plan it: its GPU wires no more than Metal
    allows."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {"ssh": "mac", "ips": ["10.0.0.1"], "max_memory_gb": 50},
                {
                    "ssh": "mini",
                    "ips": ["10.0.0.2"],
                    "memory_gb": 16,
                    "tflops": 3.5,
                    "bandwidth_gbs": 100,
                },
            ]
        )
    )
    monkeypatch.setenv(
        "MLX_RING_CAPS",
        json.dumps(
            [
                {
                    "memory_gb": 64,
                    "usable_gb": 40,
                    "working_set_gb": 30,
                    "tflops": 10,
                    "bandwidth_gbs": 400,
                }
            ]
        ),
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--layers",
        "",
        "--prompt-cache-gb",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    ]
    assert main(args) == 0
    mac = json.loads(capsys.readouterr().out)["ranks"][0]
    assert mac["host"] == "mac" and mac["working_set_gb"] == 30 and mac["usable_gb"] == 30


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
