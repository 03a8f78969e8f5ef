"""Where a decode step's time goes, rank by rank, from the events each rank's `Ring` records with
tracing on (`bench_steps.py --trace`): a step's header coming in ("in"), its stage's graph built
("built") and its payload sent on ("out"), in one clock (ranks on one host: perf_counter is the
system's monotonic clock).

A step's payload leaves rank r at out[r]. Rank r can start its part once both its graph is built and
the previous rank's payload has left; what it takes from then until its own payload leaves is its
stage (the hop in, its layers, the send; on rank 0 also the head and sampling of the group's last
step). The period is the time between two steps of a group leaving rank 0; what the stages do not
account for is the hop back to rank 0 and rank 0's Python between steps.
"""

from collections import defaultdict

from mlx_ring.ring.protocol import Kind


def between_pings(events: list[tuple[str, int, int, float]]) -> list[tuple[str, int, int, float]]:
    """The events between the first two PING steps (bench_steps sends one before and one after the
    traced run, with nothing else on the ring)."""
    pings = [i for i, e in enumerate(events) if e[1] == Kind.PING]
    assert len(pings) >= 6, f"expected two PING steps (3 events each), found {len(pings)} events"
    return events[pings[2] + 1 : pings[3]]


def steps(events: list[tuple[str, int, int, float]]) -> list[dict[str, tuple[int, int, float]]]:
    """One rank's events grouped by step, in order: a step starts with its "built" on rank 0 (whose
    "in" is the step coming home, later) and with its "in" on the other ranks."""
    out, home = [], 0  # rank 0: steps whose "in" has not come back yet start at out[home]
    first = events[0][0] if events else "in"
    for event, kind, group, t in events:
        if event == first:
            out.append({})
        if first == "built" and event == "in":
            assert out[home]["built"][:2] == (kind, group), "a step came home out of order"
            out[home]["in"], home = (kind, group, t), home + 1
        else:
            out[-1][event] = (kind, group, t)
    return out


def decode_times(ranks: list[list[tuple[str, int, int, float]]]) -> dict:
    """Per rank, the mean stage time (seconds) of DECODE steps, the mean period, and how many
    steps; `ranks[r]` is rank r's events, rank 0's first, covering the same steps on every rank."""
    by_rank = [steps(e) for e in ranks]
    n = len(by_rank[0])
    assert all(len(s) == n for s in by_rank), f"ranks recorded {[len(s) for s in by_rank]} steps"
    last_out: dict[int, int] = {}  # group -> index of its last DECODE step
    stage, periods = defaultdict(list), []
    for i in range(n):
        kind, group, _ = by_rank[0][i]["built"]
        if kind != Kind.DECODE:
            continue
        j = last_out.get(group)
        last_out[group] = i
        if j is None:  # the group's first step: nothing before it to measure from
            continue
        home = by_rank[-1][j]["out"][2]  # the group's last step left the last rank for rank 0
        for r, s in enumerate(by_rank):
            before = home if r == 0 else by_rank[r - 1][i]["out"][2]
            stage[r].append(s[i]["out"][2] - max(s[i]["built"][2], before))
        periods.append(by_rank[0][i]["out"][2] - by_rank[0][j]["out"][2])
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {
        "steps": len(periods),
        "period": mean(periods),
        "stage": [mean(stage[r]) for r in range(len(ranks))],
    }


def summary(times: dict) -> str:
    stages = " ".join(f"rank {r} {s * 1e3:.2f} ms" for r, s in enumerate(times["stage"]))
    rest = times["period"] - sum(times["stage"])
    return (
        f"{times['steps']} DECODE steps: period {times['period'] * 1e3:.2f} ms; stages {stages}; "
        f"hop home and rank 0's Python {rest * 1e3:.2f} ms"
    )
