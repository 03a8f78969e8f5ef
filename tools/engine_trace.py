"""Where rank 0's time goes, round by round of its engine loop, in a real server: run server.py
under this wrapper (in place of `server.py` in the mlx.launch command, or alone for one rank), then
summarise. Each round that runs a step records its wall and thread-CPU time and, within it, the
Python graph building of the steps (`Shard.apply`), their MLX encoding (the rest of
`Pipeline.submit`, or of tensor mode's `Lockstep.submit`), the wait on the device for sampled tokens
(`read_tokens`), the head, sampling, the engine's own per-token work (`_advance`) and any garbage
collection; the trace is rewritten after every finished request.

    python tools/engine_trace.py run /tmp/trace.json server.py --model DIR --port 8000
    python tools/engine_trace.py summary /tmp/trace.json

The summary gives, per request, the median decode round and its parts. Decode is bound by the host
where `read` is near zero: the period then moves with the CPU's speed, which `apply` (the same
Python work every round) measures; a constant period/apply ratio means the work per token did not
change. (On a CPU device MLX computes inside the encode, so there `encode` holds the compute.)
"""

import gc
import json
import os
import runpy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(trace: Path, argv: list[str]) -> None:
    from mlx_ring.gpu import one_gpu_per_rank

    one_gpu_per_rank()  # before `shard` starts MLX, as server.py does
    import shard  # noqa: I001 (after the line above)
    from mlx_ring.ring import pipeline
    from mlx_ring.tensor import lockstep
    from mlx_ring.serving import engine, runner

    rounds, now = [], {}

    def timed(owner, name: str, key: str) -> None:
        f = getattr(owner, name)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                now[key] = now.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapper)

    # Methods the shard binds at construction and module functions looked up at call time: patched
    # before server.py builds anything.
    for owner, name in (
        (shard.Shard, "apply"),
        (shard.Shard, "head"),
        (pipeline.Pipeline, "submit"),
        (lockstep.Lockstep, "submit"),
        (runner, "read_tokens"),
        (runner, "sample_lazy"),
        (runner, "sample_rows"),
        (engine.Engine, "_advance"),
    ):
        timed(owner, name, name.strip("_"))
    started = [0.0]
    gc.callbacks.append(
        lambda phase, info: (
            started.__setitem__(0, time.perf_counter())
            if phase == "start"
            else now.__setitem__("gc", now.get("gc", 0.0) + time.perf_counter() - started[0])
        )
    )
    serve_round, finish = engine.Engine._serve_round, engine.Engine._finish

    def traced_round(self):
        now.clear()
        t, cpu = time.perf_counter(), time.thread_time()
        serve_round(self)
        if "submit" in now or "read_tokens" in now or "sample_rows" in now:
            rounds.append(
                {"t": t, "dt": time.perf_counter() - t, "cpu": time.thread_time() - cpu, **now}
            )

    def traced_finish(self, a, outcome):
        finish(self, a, outcome)
        part = trace.with_suffix(".part")
        part.write_text(json.dumps(rounds))
        os.replace(part, trace)

    engine.Engine._serve_round, engine.Engine._finish = traced_round, traced_finish
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def summary(trace: Path) -> None:
    rounds = json.loads(trace.read_text())
    ms = lambda rs, k: statistics.median(r.get(k, 0.0) for r in rs) * 1e3  # noqa: E731
    # A request's decode rounds read ahead (read_tokens); its first token comes from a round that
    # samples without (sample_rows): runs of the first kind, split by the second, are the requests.
    runs, run_ = [], []
    for r in rounds:
        if "read_tokens" in r:
            run_.append(r)
        elif run_:
            runs.append(run_)
            run_ = []
    runs += [run_] if run_ else []
    print(
        (
            "decode per request: rounds, period, CPU, apply (Python), encode (MLX), read (device), "
            "advance ms; period/apply"
        )
    )
    for n, decode in enumerate(runs):
        apply, period = ms(decode, "apply"), ms(decode, "dt")
        print(
            f"{n:3d}: {len(decode):4d} {period:6.2f} {ms(decode, 'cpu'):6.2f} {apply:5.2f} "
            f"{ms(decode, 'submit') - apply:5.2f} {ms(decode, 'read_tokens'):6.3f} "
            f"{ms(decode, 'advance'):5.2f}  {period / apply:5.2f}"
        )
    ahead = sum("read_tokens" in r for r in rounds)
    print(
        f"rounds: {len(rounds)}, of which {ahead} read ahead (the next step built before "
        "the tokens were read), "
        f"{sum('sample_rows' in r for r in rounds)} sampled after their step was read"
    )
    slow = [
        (i, round(r["dt"] * 1e3), round(r.get("submit", 0) * 1e3), round(r.get("gc", 0) * 1e3))
        for i, r in enumerate(rounds)
        if r["dt"] > 0.05
    ]
    print("rounds over 50 ms (index, ms, of which submitting steps, garbage collection):", slow)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        run(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
