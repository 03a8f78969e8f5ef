"""The plan's assembly from a ring's hosts: hosts.json's keys on each host's capabilities, the
prompt cache set aside (test_prompt_cache_plan.py), and `plan_for`, the one assembly every caller
runs: pure, no MLX."""

import pytest
from planshapes import LLAMA_8B

from mlx_ring.planning.capabilities import Capabilities, with_host_keys


def test_max_memory_gb_caps_the_budget_and_bad_keys_are_named():
    cap = with_host_keys(Capabilities("studio", 48, 36, 30, 546), {"max_memory_gb": 20})
    assert cap.usable_gb == 20
    assert with_host_keys(cap, {"memory_gb": 16}).usable_gb == pytest.approx(16 * 2 / 3)
    with pytest.raises(ValueError, match="studio: tflops must be a positive number"):
        with_host_keys(cap, {"tflops": "fast"})


def test_plan_for_applies_host_keys_then_shares_hosts_then_sets_the_prompt_cache_aside():
    """The one assembly every caller runs: keys win, ranks on one host split it,
    the cache comes off."""
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
