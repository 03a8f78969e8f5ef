"""Where a decode step's host time goes, for `bench_steps.py --split`: the ring's scheduler and
mlx-lm's `generate_step` timed by the same three parts (as `engine_trace.py` does in a server):
Python building the graph, MLX encoding it (`async_eval`), and the wait for the sampled token."""

import statistics
import time
from contextlib import contextmanager

import mlx.core as mx


class Clock:
    """Seconds spent in wrapped calls, by part, within each step (`tick` closes a step)."""

    def __init__(self):
        self.now: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.t = time.perf_counter()

    def wrap(self, f, part: str):
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                self.now[part] = self.now.get(part, 0.0) + time.perf_counter() - t
        return timed

    def tick(self) -> None:
        t = time.perf_counter()
        self.steps.append({"step": t - self.t, **self.now})
        self.now, self.t = {}, t

    def line(self, name: str, parts: tuple[str, ...]) -> str:
        rows = self.steps[2:]  # the first steps hold the prefill
        ms = {p: statistics.median(r.get(p, 0.0) for r in rows) * 1e3 for p in ("step", *parts)}
        ms["other"] = statistics.median(r["step"] - sum(r.get(p, 0.0) for p in parts) for r in rows) * 1e3
        steps = [r["step"] * 1e3 for r in rows]  # the median hides slow steps; the tokens/s counts them
        return (f"{name}: median ms a step over {len(rows)} steps: " + ", ".join(f"{p} {v:.2f}" for p, v in ms.items())
                + f"; step mean {statistics.mean(steps):.2f}, max {max(steps):.2f}")


@contextmanager
def patched(owner, name: str, f):
    old = getattr(owner, name)
    setattr(owner, name, f)
    try:
        yield
    finally:
        setattr(owner, name, old)


class Timed:
    """A model whose calls (graph building) are timed; everything else passes through."""

    def __init__(self, model, clock: Clock):
        self._model, self._call = model, clock.wrap(model.__call__, "python")

    def __call__(self, *a, **kw):
        return self._call(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._model, name)


def split_generate_step(model, prompt: list[int], max_tokens: int) -> str:
    """mlx-lm's loop: python = the model's forward built (its sampler is one argmax), encode =
    `mx.async_eval`, wait = the rest of the step (the token read and the loop)."""
    from mlx_lm.generate import generate_step
    from mlx_lm_loop import GREEDY

    clock = Clock()
    with patched(mx, "async_eval", clock.wrap(mx.async_eval, "encode")):
        for _ in generate_step(mx.array(prompt), Timed(model, clock), max_tokens=max_tokens, sampler=GREEDY):
            clock.tick()
    return clock.line("generate_step", ("python", "encode"))


def split_ring(sched, run, max_tokens: int, prompt) -> str:
    """The ring's scheduler, one stream: python = the stage, head and sampling built (`Shard.apply`,
    `head`, `sample_lazy`), encode = the rest of `Pipeline.submit` (its `async_eval`) and the
    head's prefetch, wait = `read_tokens`; `run` is bench_steps' driver."""
    from mlx_ring.serving import runner as sch

    clock, shard, pipe = Clock(), sched.pipe.stage, sched.pipe
    apply, submit, prefetch = shard.apply, pipe.submit, pipe.prefetch
    timed_apply = clock.wrap(apply, "python")

    def timed_submit(*a, **kw):  # encode: submit less the stage's building
        t, before = time.perf_counter(), clock.now.get("python", 0.0)
        try:
            return submit(*a, **kw)
        finally:
            inner = clock.now.get("python", 0.0) - before
            clock.now["encode"] = clock.now.get("encode", 0.0) + time.perf_counter() - t - inner

    step = sched.step

    def ticking():
        out = step()
        if out:
            clock.tick()
        return out

    with patched(shard, "apply", timed_apply), patched(shard, "head", clock.wrap(shard.head, "python")), \
            patched(pipe, "submit", timed_submit), patched(pipe, "prefetch", clock.wrap(prefetch, "encode")), \
            patched(sch, "sample_lazy", clock.wrap(sch.sample_lazy, "python")), \
            patched(sch, "read_tokens", clock.wrap(sch.read_tokens, "wait")), patched(sched, "step", ticking):
        clock.t = time.perf_counter()
        run(sched, 1, max_tokens, prompt)
    return clock.line(f"ring-{pipe.ring.size}", ("python", "encode", "wait"))
