"""bench_steps --trace on a real 2-rank ring: every rank records the same steps, in
ring order, and the decode timeline is computed from them (mlx_ring/ring/timeline.py;
its arithmetic: tests/unit)."""

import json

from ringutil import launch, make_tiny_model

from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.timeline import steps


def test_every_rank_records_the_traced_steps_in_ring_order(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama", n_layers=4)
    trace = tmp_path / "trace.json"
    proc = launch(
        2,
        tmp_path,
        [
            "tools/bench_steps.py",
            "--model",
            str(model),
            "--streams",
            "3",
            "--max-tokens",
            "6",
            "--chunk",
            "16",
            "--groups",
            "2",
            "--trace",
            str(trace),
        ],
        timeout=240,
    )
    ranks = json.loads(trace.read_text())
    assert not list(tmp_path.glob("trace.json.rank*")), "rank 1's own file is merged, then removed"
    by_rank = [steps([tuple(e) for e in events]) for events in ranks]
    kinds = [[s["built"][:2] for s in rank] for rank in by_rank]
    assert kinds[0] == kinds[1], "both ranks applied the same steps in the same order"
    assert all(set(s) == {"in", "built", "out"} for rank in by_rank for s in rank), (
        "every step came home"
    )
    decodes = sum(kind == Kind.DECODE for kind, _ in kinds[0])
    # 6 tokens a stream: the first from the prefill, the rest one DECODE step each
    assert decodes >= 5
    line = next(ln for ln in proc.stdout.splitlines() if "DECODE steps" in ln)
    # the 3 streams spread over the 2 groups; a group's first step has no period before it
    assert line.startswith(f"2 rank(s), 3 streams: {decodes - 2} DECODE steps: period "), line


def test_bench_tensor_matches_mlx_lm_shard_loop_and_times_every_rank(tmp_path):
    """tools/bench_tensor.py on a 2-rank tensor ring: the scheduler's greedy tokens equal
    mlx-lm's own loop on the model its shard() cut (one stream and a batch), and the trace splits
    a decode step on every rank."""
    model = make_tiny_model(tmp_path / "model", "llama", n_layers=2, vocab_size=32000)
    trace = tmp_path / "trace.json"
    proc = launch(
        2,
        tmp_path,
        [
            "tools/bench_tensor.py",
            "--model",
            str(model),
            "--streams",
            "1,3",
            "--max-tokens",
            "6",
            "--rounds",
            "2",
            "--peers",
            "--split",
            "--trace",
            str(trace),
        ],
        timeout=240,
    )
    lines = proc.stdout.splitlines()
    for n, peer in ((1, "generate_step"), (3, "BatchGenerator")):
        ring = next(ln for ln in lines if ln.startswith(f"tensor-2 ring: {n} streams:"))
        other = next(ln for ln in lines if ln.startswith(f"tensor-2 peer: {peer}: {n} streams:"))
        assert ring.rsplit("tokens ", 1)[1] == other.rsplit("tokens ", 1)[1], (ring, other)
    assert any(
        ln.startswith("tensor-2, 3 streams: ring ") and "ring/mlx-lm speed median" in ln
        for ln in lines
    )
    ranks = json.loads(trace.read_text())
    assert len(ranks) == 2 and not list(tmp_path.glob("trace.json.rank*")), (
        "rank 1's own file is merged, then removed"
    )
    # 6 tokens: the first from the prefill, 5 from DECODE steps, and one step chained past the last
    assert any(ln.startswith("rank 0: 6 DECODE steps of ") for ln in lines), lines[-3:]
    assert any(
        ln.startswith("rank 1: hop ") and "waiting for the next header" in ln for ln in lines
    ), lines[-3:]
    # Rank 0's step and mlx-lm's own loop, split alike into the host's parts and its CPU time.
    assert any(
        ln.startswith("ring-2: median ms a step") and "CPU time: python" in ln for ln in lines
    ), lines[-5:]
    assert (
        sum(ln.startswith("mlx-lm's loop, rank 0: generate_step: median ms a step") for ln in lines)
        == 2
    ), lines[-3:]
