"""--split of bench_steps.py and bench_tensor.py: one stream's decode step timed by its parts
(Python, MLX encoding, the wait for the token), for the ring's scheduler and mlx-lm's loop.
"""

import statistics
import time
from contextlib import ExitStack, contextmanager
from typing import Callable

import mlx.core as mx
import mlx_lm_loop
from mlx_lm.generate import generate_step
from scheduler_run import GREEDY, run

from mlx_ring.serving import runner
from mlx_ring.serving.scheduler import Scheduler


class Clock:
    """Seconds spent in wrapped calls, by part, within each step (`tick` closes a step): where a
    decode step's host time goes, as --split prints it."""

    def __init__(self):
        self.now: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.t = time.perf_counter()

    def wrap(self, f, part: str):
        def timed(*a, **kw):
            t, cpu = time.perf_counter(), time.thread_time()
            try:
                return f(*a, **kw)
            finally:
                self.add(part, time.perf_counter() - t)
                # this thread's CPU time too: on a shared machine, steadier than the wall clock
                self.add(f"{part} cpu", time.thread_time() - cpu)

        return timed

    def add(self, part: str, seconds: float) -> None:
        self.now[part] = self.now.get(part, 0.0) + seconds

    def tick(self) -> None:
        t = time.perf_counter()
        self.steps.append({"step": t - self.t, **self.now})
        self.now, self.t = {}, t

    def line(self, name: str, parts: tuple[str, ...]) -> str:
        rows = self.steps[2:]  # the first steps hold the prefill
        med = lambda f: statistics.median(f(r) for r in rows) * 1e3  # noqa: E731
        ms = {p: med(lambda r: r.get(p, 0.0)) for p in ("step", *parts)}
        ms["other"] = med(lambda r: r["step"] - sum(r.get(p, 0.0) for p in parts))
        steps = [r["step"] * 1e3 for r in rows]  # the median hides slow steps; tokens/s counts them
        cpu = ", ".join(f"{p} {med(lambda r: r.get(p + ' cpu', 0.0)):.2f}" for p in parts)
        return (
            f"{name}: median ms a step over {len(rows)} steps: "
            + ", ".join(f"{p} {v:.2f}" for p, v in ms.items())
            + f"; step mean {statistics.mean(steps):.2f}, max {max(steps):.2f}"
            + f"; this thread's CPU time: {cpu}"
        )


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


def split_generate_step(
    model, prompt: list[int], max_tokens: int, sampler=mlx_lm_loop.GREEDY, processors=None
) -> str:
    """mlx-lm's loop: python = the model's forward built (sampling, greedy unless `sampler` and
    `processors` say other, is in the rest), encode = `mx.async_eval`, wait = the rest of the step
    (the token read and the loop)."""
    clock = Clock()
    with patched(mx, "async_eval", clock.wrap(mx.async_eval, "encode")):
        steps = generate_step(
            mx.array(prompt),
            Timed(model, clock),
            max_tokens=max_tokens,
            sampler=sampler,
            logits_processors=processors,
        )
        for _ in steps:
            clock.tick()
    return clock.line("generate_step", ("python", "encode"))


def split_ring(
    sched: Scheduler, max_tokens: int, prompt: Callable[[int], list[int]], params=GREEDY
) -> str:
    """The ring's scheduler, one stream (greedy, unless `params` say other): python = the stage,
    head and sampling built (`Shard.apply`, `head`, `sample_lazy`), send = the step's header (and
    payload) leaving on the ring, encode = the rest of `submit` (its `async_eval`) and the head's
    prefetch, wait = `read_tokens` and (in tensor mode) the wait for the last step inside
    `submit`."""
    clock, shard, pipe = Clock(), sched.pipe.stage, sched.pipe
    submit, inner = pipe.submit, ("python", "wait", "send")

    def timed_submit(*a, **kw):  # encode: submit less its other parts, in wall and CPU time
        clocks = {"": time.perf_counter, " cpu": time.thread_time}
        start = {c: (f(), sum(clock.now.get(p + c, 0.0) for p in inner)) for c, f in clocks.items()}
        try:
            return submit(*a, **kw)
        finally:
            for c, f in clocks.items():
                nested = sum(clock.now.get(p + c, 0.0) for p in inner) - start[c][1]
                clock.add("encode" + c, f() - start[c][0] - nested)

    step = sched.step

    def ticking():
        out = step()
        if out:
            clock.tick()
        return out

    timed = [
        (shard, "apply", "python"),
        (shard, "head", "python"),
        (pipe, "prefetch", "encode"),
        (pipe, "settle", "wait"),
        (pipe.ring, "send", "send"),
        (runner, "sample_lazy", "python"),
        (runner, "read_tokens", "wait"),
    ]
    parts = [(owner, name, clock.wrap(getattr(owner, name), part)) for owner, name, part in timed]
    with ExitStack() as stack:
        for owner, name, f in [*parts, (pipe, "submit", timed_submit), (sched, "step", ticking)]:
            stack.enter_context(patched(owner, name, f))
        clock.t = time.perf_counter()
        run(sched, 1, max_tokens, prompt, params)
    return clock.line(f"ring-{pipe.ring.size}", ("python", "send", "encode", "wait"))
