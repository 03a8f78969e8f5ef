"""Decode steps chained, and how the workers waited, request feature by request feature: the real
scheduler (no HTTP) on a real ring in tensor or pipeline mode, counted from every rank's trace. Run
it under mlx.launch, ranks on one host (their traces share one clock):

    python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- \\
        python tools/bench_chain.py --model DIR --mode tensor

One line a scenario (a few rows of one request feature, or rows joining and leaving):
- its DECODE steps and how many went out chained (built on ids not yet read; a group's first
  decode step cannot be);
- tensor mode: how many no worker waited for on rank 0's host (the step's header was on each
  worker before rank 0 had read the step it follows, so the worker queued it while that one ran);
- the pipeline: a worker's median wait from its last step sent to the next step's header (rank 0's
  stage and the hops: a pipeline's stages take turns);
- rank 0's median decode period.
"""

import argparse
import json
import statistics
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

from mlx_lm.utils import load_tokenizer  # noqa: E402
from ring_join import collect_traces, join_ring  # noqa: E402

from mlx_ring.ring.protocol import Header, Kind  # noqa: E402
from mlx_ring.ring.timeline import between_each_ping, steps, tensor_steps  # noqa: E402
from mlx_ring.serving.grammar import Grammars  # noqa: E402
from mlx_ring.serving.grammar_text import json_grammar  # noqa: E402
from mlx_ring.serving.params import SamplingParams as P  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler, Sequence  # noqa: E402

# a grammar that keeps its rows going: 40 integers at least, more than a row's tokens
SCHEMA = {"type": "array", "items": {"type": "integer"}, "minItems": 40}


def scenarios(tokens: int, grammar: str) -> dict[str, list[tuple[P, int, int]]]:
    """Each scenario's rows: (settings, tokens, the scheduler round it arrives in)."""
    greedy = P(temperature=0.0)
    at_once = lambda *ps: [(p, tokens, 0) for p in ps]  # noqa: E731
    return {
        "greedy": at_once(greedy, greedy, greedy),
        "seed": at_once(P(temperature=0.8, seed=5), P(temperature=0.8, seed=6), greedy),
        "penalties": at_once(
            P(temperature=0.0, repetition_penalty=1.3),
            P(temperature=0.0, presence_penalty=0.5),
            P(temperature=0.0, frequency_penalty=0.7),
        ),
        "logit_bias": at_once(P(temperature=0.0, logit_bias={3: 2.0, 17: -1.0}), greedy),
        "top_logprobs": at_once(P(temperature=0.0, top_logprobs=3), greedy),
        "json_schema": at_once(P(temperature=0.0, grammar=grammar), greedy),
        "mixed temperatures": at_once(
            greedy, P(temperature=0.7, top_p=0.9, seed=1), P(temperature=1.2, top_k=20, seed=2)
        ),
        # staggered arrivals, varied lengths: rows join and leave a running group
        "joining and leaving": [
            (greedy, tokens // 2, 0),
            (P(temperature=0.7, seed=3), tokens, 0),
            (greedy, tokens // 3, tokens // 4),
            (P(temperature=0.0, top_logprobs=2), tokens // 2, tokens // 3),
            (greedy, tokens // 2, tokens // 2),
        ],
    }


def run(sched: Scheduler, rows: list[tuple[P, int, int]], constrain) -> list[tuple[int, bool]]:
    """The rows through the scheduler, each arriving in its round and removed after its tokens;
    returns (kind, chained) of every step submitted, in order."""
    pipe, log = sched.pipe, []
    submit = pipe.submit

    def noting(header, payload, tag=None, chained=False):
        log.append((header.kind, chained))
        submit(header, payload, tag, chained)

    pipe.submit = noting
    seqs = [
        (Sequence(i, [(7 * i + j) % 200 + 10 for j in range(12)], p, constrain=constrain), n, at)
        for i, (p, n, at) in enumerate(rows)
    ]
    waiting, got, rounds = list(seqs), {}, 0
    while waiting or not sched.idle():
        if sched.idle():  # nothing running: the next row arrives now
            rounds = max(rounds, waiting[0][2])
        for s, n, at in [w for w in waiting if w[2] <= rounds]:
            sched.add(s)
            got[s.id], waiting = (0, n), [w for w in waiting if w[0] is not s]
        for s, t in sched.step():
            assert not isinstance(t, Exception), t
            count, n = got[s.id]
            got[s.id] = (count + 1, n)
            if count + 1 == n:
                sched.remove(s)
        rounds += 1
    pipe.submit = submit
    return log


def waits(ranks: list[list], tensor: bool) -> tuple[str, list[float]]:
    """How the workers waited on DECODE steps after the first (the module's doc), in words; and
    rank 0's periods between DECODE steps (seconds)."""
    if tensor:
        by = [tensor_steps(events, r) for r, events in enumerate(ranks)]
        kind, t = (lambda s: s["kind"]), (lambda s, e: s[e])
    else:
        by = [steps(events) for events in ranks]
        kind, t = (lambda s: s["built"][0]), (lambda s, e: s[e][2])
    s0, ahead, idle, periods, last = by[0], [], [], [], None
    for i, s in enumerate(s0):
        if kind(s) != Kind.DECODE:
            continue
        if last is not None:
            if tensor:  # rank 0 read step `last` after it sent step i: was i on each worker then?
                ahead.append(all(t(w[i], "in") < t(s0[last], "done") for w in by[1:]))
            else:  # from a worker's last step sent to this one's header
                idle += [t(w[i], "in") - t(w[i - 1], "out") for w in by[1:]]
            periods.append(t(s, "out") - t(s0[last], "out"))
        last = i
    if tensor:
        return f"no worker waited {sum(ahead)}/{len(ahead)}", periods
    return f"a worker idle {statistics.median(idle) * 1e3:.2f} ms a step", periods


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--tokenizer", type=Path, default=None, help="for the grammar (default: model)")
    p.add_argument("--mode", choices=("tensor", "pipeline"), default="tensor")
    p.add_argument("--tokens", type=int, default=64, help="tokens a row")
    p.add_argument(
        "--trace", type=Path, default=Path("chain-trace.json"), help="every rank's events, here"
    )
    a = p.parse_args()
    tensor = a.mode == "tensor"
    pipe = join_ring(a.model, a.trace, tensor=tensor)
    if pipe is None:
        return
    shard = pipe.stage
    # tensor mode runs one decode group, as the server does; the pipeline one a rank
    sched = Scheduler(pipe, shard, groups=1 if tensor else 0)
    config = json.loads((a.model / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    grammars = Grammars(load_tokenizer(a.tokenizer or a.model), vocab)
    todo = scenarios(a.tokens, json_grammar(SCHEMA))
    run(sched, [(P(temperature=0.0), 4, 0)] * 2, grammars.processor)  # warm-up
    logs = []
    for rows in todo.values():
        pipe.round_trip(Header(Kind.PING))
        logs.append(run(sched, rows, grammars.processor))
    pipe.round_trip(Header(Kind.PING))
    events = collect_traces(pipe, a.trace)
    a.trace.write_text(json.dumps(events))
    ranks = [between_each_ping(e) for e in events]
    size = pipe.ring.size
    for k, (name, log) in enumerate(zip(todo, logs)):
        decode = [chained for kind, chained in log if kind == Kind.DECODE]
        waited, periods = waits([r[k] for r in ranks], tensor)
        period = statistics.median(periods) * 1e3 if periods else float("nan")
        print(
            f"{a.mode} {size} ranks, {name}: {len(decode)} DECODE steps, chained "
            f"{sum(decode)}/{len(decode)}, {waited}, "
            f"period {period:.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
