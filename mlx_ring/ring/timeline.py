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
    runs = between_each_ping(events)
    pings = sum(e[1] == Kind.PING for e in events)
    assert runs, f"expected two PING steps (3 events each), found {pings} events"
    return runs[0]


def between_each_ping(events: list) -> list[list]:
    """The runs of events between PING steps (a PING is a few events in a row), in order."""
    runs, run, last_ping = [], [], False
    for e in events:
        if e[1] == Kind.PING:
            if not last_ping:
                runs.append(run)
                run = []
            last_ping = True
        else:
            run.append(e)
            last_ping = False
    return runs[1:]  # what came before the first PING is no run between two


def tensor_steps(events: list, rank: int) -> list[dict]:
    """Tensor mode's events grouped by step, each step's times by event name: a step starts with
    its header leaving rank 0 ("out") or arriving on a worker ("in"). Every rank builds every step
    and marks it "done" once each, in order, but maybe during another step (it finishes a decode
    step during the next one): its k-th is its k-th step's."""
    start, out, ordered = ("out" if rank == 0 else "in"), [], {"built": [], "done": []}
    for event, kind, _group, t in events:
        if event == start:
            out.append({"kind": kind})
        if event in ordered:
            ordered[event].append(t)
        else:
            out[-1].setdefault(event, t)
    for event, times in ordered.items():
        for step, t in zip(out, times):
            step[event] = t
    return out


def steps(events: list[tuple[str, int, int, float]]) -> list[dict[str, tuple[int, int, float]]]:
    """One rank's events grouped by step, in order: a step starts with its "built" on rank 0 (whose
    "out" may come after later steps are built, as they wait for their place on the ring, and
    whose "in" is the step coming home) and with its "in" on the other ranks."""
    out = []
    # rank 0: the first step not yet sent, and the first not yet home
    later = {"out": 0, "in": 0}
    first = events[0][0] if events else "in"
    for event, kind, group, t in events:
        if event == first:
            out.append({})
        if first == "built" and event in later:
            i = later[event]
            assert out[i]["built"][:2] == (kind, group), f"a step's {event} came out of order"
            out[i][event], later[event] = (kind, group, t), i + 1
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
