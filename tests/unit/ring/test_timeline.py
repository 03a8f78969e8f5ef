"""The decode timeline bench_steps --trace prints: each rank's stage and the period, from the events
the ranks record (known times in, known times out)."""

import pytest

from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.timeline import (
    between_each_ping,
    between_pings,
    decode_times,
    steps,
    tensor_steps,
)

DECODE, FILTER, PING, SHUTDOWN = Kind.DECODE, Kind.FILTER, Kind.PING, Kind.SHUTDOWN


def two_ranks():
    # Group 0 decodes twice with a FILTER between; group 1's one step overlaps (rank 0 submits it
    # while group 0's first step is out, so its "in" comes home in ring order, after group 0's).
    rank0 = [
        ("built", DECODE, 0, 0.0),
        ("out", DECODE, 0, 1.0),
        ("built", DECODE, 1, 1.2),
        ("out", DECODE, 1, 2.0),
        ("in", DECODE, 0, 3.0),
        ("in", DECODE, 1, 4.0),
        ("built", FILTER, 0, 4.1),
        ("out", FILTER, 0, 4.2),
        ("in", FILTER, 0, 4.6),
        ("built", DECODE, 0, 4.7),
        ("out", DECODE, 0, 6.0),
        ("in", DECODE, 0, 8.0),
    ]
    rank1 = [
        ("in", DECODE, 0, 0.5),
        ("built", DECODE, 0, 0.8),
        ("out", DECODE, 0, 2.5),
        ("in", DECODE, 1, 2.6),
        ("built", DECODE, 1, 2.7),
        ("out", DECODE, 1, 3.9),
        ("in", FILTER, 0, 4.3),
        ("built", FILTER, 0, 4.4),
        ("out", FILTER, 0, 4.5),
        ("in", DECODE, 0, 4.8),
        ("built", DECODE, 0, 4.9),
        ("out", DECODE, 0, 7.5),
    ]
    return rank0, rank1


def test_each_rank_stage_starts_when_both_its_graph_and_its_input_are_ready():
    rank0, rank1 = two_ranks()
    times = decode_times([rank0, rank1])
    # Group 0's second step: rank 0 starts at 4.7 (its graph; the input came home at 2.5)
    # and sends at 6.0; rank 1's graph is ready at 4.9 but its input leaves rank 0 at 6.0,
    # and it sends at 7.5.
    assert times["steps"] == 1  # each group's first step has nothing before it to measure from
    assert times["stage"] == pytest.approx([1.3, 1.5])
    assert times["period"] == pytest.approx(5.0)


def test_rank_0_steps_come_home_in_order():
    rank0, _ = two_ranks()
    grouped = steps(rank0)
    assert [s["built"][:2] for s in grouped] == [(DECODE, 0), (DECODE, 1), (FILTER, 0), (DECODE, 0)]
    assert [s["in"][2] for s in grouped] == [3.0, 4.0, 4.6, 8.0]
    swapped = rank0[:4] + [rank0[5], rank0[4]]
    with pytest.raises(AssertionError, match="out of order"):
        steps(swapped)


def test_only_the_events_between_the_two_pings_count():
    ping = [("built", PING, 0, 0.0), ("out", PING, 0, 0.1), ("in", PING, 0, 0.2)]
    rank0, _ = two_ranks()
    warm = [("built", DECODE, 0, -2.0), ("out", DECODE, 0, -1.5), ("in", DECODE, 0, -1.0)]
    shutdown = [("built", SHUTDOWN, 0, 9.0), ("out", SHUTDOWN, 0, 9.1)]
    assert between_pings(warm + ping + rank0 + ping + shutdown) == rank0
    with pytest.raises(AssertionError, match="two PING steps"):
        between_pings(rank0)


def test_a_step_built_while_the_last_waits_for_its_place_gets_its_own_out():
    # group 1's step is built behind a FILTER that waits for room on the ring, so both "built"s
    # come before either "out"
    rank0 = [
        ("built", FILTER, 0, 0.0),
        ("built", DECODE, 1, 0.5),
        ("out", FILTER, 0, 1.0),
        ("in", FILTER, 0, 2.0),
        ("out", DECODE, 1, 2.1),
        ("in", DECODE, 1, 3.0),
    ]
    grouped = steps(rank0)
    assert [(s["built"][2], s["out"][2], s["in"][2]) for s in grouped] == [
        (0.0, 1.0, 2.0),
        (0.5, 2.1, 3.0),
    ]


def test_runs_between_pings_and_tensor_steps_done_in_order():
    ping = [("out", PING, 0, 0.0), ("built", PING, 0, 0.1), ("done", PING, 0, 0.2)]
    # rank 0 in tensor mode: a decode step is done after the next one went out
    first = [
        ("out", DECODE, 0, 1.0),
        ("built", DECODE, 0, 1.1),
        ("out", DECODE, 0, 2.0),
        ("built", DECODE, 0, 2.1),
        ("done", DECODE, 0, 2.5),
        ("done", DECODE, 0, 3.5),
    ]
    second = [("out", FILTER, 0, 5.0), ("built", FILTER, 0, 5.1), ("done", FILTER, 0, 5.2)]
    runs = between_each_ping([("out", DECODE, 0, -1.0)] + ping + first + ping + second + ping)
    assert runs == [first, second]
    assert [(s["out"], s["built"], s["done"]) for s in tensor_steps(first, 0)] == [
        (1.0, 1.1, 2.5),
        (2.0, 2.1, 3.5),
    ]
