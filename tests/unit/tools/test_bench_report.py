"""The benchmark's ratio table: each ring against one rank and against the replicas' ceiling."""

from tools.bench_report import ratios


def result(target: str, aggregates: dict[int, float]) -> dict:
    return {
        "target": target,
        "runs": [{"concurrency": c, "aggregate_tps": v} for c, v in aggregates.items()],
    }


def test_each_ring_is_set_against_one_rank_and_the_replicas():
    lines = ratios(
        [
            result("ring-1", {8: 50.0, 16: 80.0}),
            result("ring-2", {8: 55.0, 16: 84.0}),
            result("replicas-2", {8: 60.0, 16: 0.0}),
            result("mlx_lm", {8: 40.0, 16: 70.0}),
        ]
    )
    assert lines[1] == "| target | concurrency | aggregate over ring-1 | aggregate over replicas |"
    assert lines[3:] == ["| ring-2 | 8 | 1.10x | 0.92x |", "| ring-2 | 16 | 1.05x | - |"]


def test_no_table_without_one_rank_to_compare_with():
    assert ratios([result("ring-2", {8: 55.0}), result("replicas-2", {8: 60.0})]) == []
    assert ratios([result("ring-1", {8: 50.0}), result("mlx_lm", {8: 40.0})]) == []


def test_a_tensor_ring_is_set_against_one_rank_too():
    lines = ratios(
        [result("ring-1", {1: 20.0}), result("ring-2", {1: 18.0}), result("tensor-2", {1: 30.0})]
    )
    assert lines[3:] == ["| ring-2 | 1 | 0.90x |", "| tensor-2 | 1 | 1.50x |"]
