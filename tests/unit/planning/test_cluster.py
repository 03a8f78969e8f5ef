"""The cluster record rank 0 serves from (planning/cluster.py): what /cluster/status shows of it is
every rank's own facts and the planner's summary of it, key for key."""

from dataclasses import replace

from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cluster import Cluster, PlanFacts, Prediction, RankFacts
from mlx_ring.planning.plan import ModelSpec, uniform_plan
from mlx_ring.planning.report import summary

SPEC = ModelSpec(
    n_layers=8,
    layer_bytes=1e8,
    ends_bytes=2e8,
    head_read_bytes=2e8,
    kv_bytes_per_token=1e4,
    layer_read_bytes=1e8,
    layer_flops=1e9,
)


def gathered() -> tuple[Cluster, list[dict], dict]:
    caps = [
        Capabilities(host=h, memory_gb=16, usable_gb=12, tflops=1.0, bandwidth_gbs=10.0)
        for h in "ab"
    ]
    plan = uniform_plan(8, 2)
    predicted = summary(SPEC, caps, plan, 512)
    predicted["ranks"][1]["prompt_cache_gb"] = 0.5
    infos = [
        {
            "rank": r,
            "host": h,
            "layers": list(plan.ranges[r]),
            "parameter_bytes": 10_000_000 + r,
            "holds_embedding": r == 0,
            "holds_head": r == 0,
        }
        for r, h in enumerate("ab")
    ]
    ranks = tuple(RankFacts.of(info, view) for info, view in zip(infos, predicted["ranks"]))
    return (
        Cluster(
            ranks, PlanFacts(plan.strategy, plan.n_layers, plan.ranges, Prediction.of(predicted))
        ),
        infos,
        predicted,
    )


def test_the_status_json_is_each_ranks_facts_and_the_planners_summary():
    cluster, infos, predicted = gathered()
    shown = cluster.to_json()
    for row, info, view in zip(shown["ranks"], infos, predicted["ranks"]):
        own = {k: v for k, v in info.items() if k != "parameter_bytes"} | {
            "parameter_bytes_kib": info["parameter_bytes"] >> 10
        }
        assert row == view | own  # the rank's own facts win where both name a key
    assert (
        "prompt_cache_gb" not in shown["ranks"][0] and shown["ranks"][1]["prompt_cache_gb"] == 0.5
    )
    assert shown["plan"] == {
        "strategy": "uniform",
        "mode": "pipeline",
        "tensor": 1,
        "n_layers": 8,
        "ranges": [[0, 4], [4, 8]],
    } | {
        k: predicted[k]
        for k in ("kv_tokens", "kv_capacity_tokens", "predicted_tokens_per_s", "slowest_stage_ms")
    }
    assert cluster.kv_room == predicted["kv_capacity_tokens"] and cluster.hosts() == {
        0: "a",
        1: "b",
    }


def test_the_kv_room_after_the_warm_up_changes_only_that_figure():
    cluster, _, _ = gathered()
    fitted = cluster.with_kv_room(cluster.kv_room - 100)
    assert fitted.kv_room == cluster.kv_room - 100
    assert fitted.to_json()["plan"] == cluster.to_json()["plan"] | {
        "kv_capacity_tokens": cluster.kv_room - 100
    }
    assert fitted.ranks == cluster.ranks


def test_without_a_prediction_the_plan_shows_its_ranges_alone():
    cluster, infos, _ = gathered()
    bare = replace(
        cluster,
        ranks=tuple(RankFacts.of(i) for i in infos),
        plan=replace(cluster.plan, prediction=None),
    )
    assert bare.kv_room is None
    assert bare.to_json()["plan"] == {
        "strategy": "uniform",
        "mode": "pipeline",
        "tensor": 1,
        "n_layers": 8,
        "ranges": [[0, 4], [4, 8]],
    }
    assert set(bare.to_json()["ranks"][0]) == {
        "rank",
        "host",
        "layers",
        "parameter_bytes_kib",
        "holds_embedding",
        "holds_head",
    }
