"""The layer plan is a pure function: property tests, no MLX."""

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
