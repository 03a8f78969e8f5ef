"""Where a decode step's host time goes, for `bench_steps.py --split`: the ring's scheduler and
mlx-lm's `generate_step` timed by the same three parts (as `engine_trace.py` does in a server):
Python building the graph, MLX encoding it (`async_eval`), and the wait for the sampled token;
then the Python calls and MLX operations a step takes, counted (`counts`)."""

import cProfile
import pstats
import re
import statistics
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable

import mlx.core as mx


class Clock:
    """Seconds spent in wrapped calls, by part, within each step (`tick` closes a step)."""

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
                self.now[part] = self.now.get(part, 0.0) + time.perf_counter() - t
                # this thread's CPU time too: on a shared machine, steadier than the wall clock
                self.now[f"{part} cpu"] = self.now.get(f"{part} cpu", 0.0) + time.thread_time() - cpu
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
                + f"; step mean {statistics.mean(steps):.2f}, max {max(steps):.2f}"
                + "; this thread's CPU time: " + ", ".join(
                    f"{p} {statistics.median(r.get(p + ' cpu', 0.0) for r in rows) * 1e3:.2f}" for p in parts))


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
    `head`, `sample_lazy`), send = the step's header (and payload) leaving on the ring, encode = the
    rest of `submit` (its `async_eval`) and the head's prefetch, wait = `read_tokens` and (in tensor
    mode) the wait for the last step inside `submit`; `run` is bench_steps' driver."""
    from mlx_ring.serving import runner as sch

    clock, shard, pipe = Clock(), sched.pipe.stage, sched.pipe
    apply, submit, prefetch = shard.apply, pipe.submit, pipe.prefetch
    inner = ("python", "wait", "send")

    def timed_submit(*a, **kw):  # encode: submit less what is timed as its other parts, in wall and CPU time
        clocks = {"": time.perf_counter, " cpu": time.thread_time}
        start = {c: (f(), sum(clock.now.get(p + c, 0.0) for p in inner)) for c, f in clocks.items()}
        try:
            return submit(*a, **kw)
        finally:
            for c, f in clocks.items():
                nested = sum(clock.now.get(p + c, 0.0) for p in inner) - start[c][1]
                clock.now["encode" + c] = clock.now.get("encode" + c, 0.0) + f() - start[c][0] - nested

    step = sched.step

    def ticking():
        out = step()
        if out:
            clock.tick()
        return out

    parts = [(shard, "apply", clock.wrap(apply, "python")), (shard, "head", clock.wrap(shard.head, "python")),
             (pipe, "submit", timed_submit), (pipe, "prefetch", clock.wrap(prefetch, "encode")),
             (pipe, "settle", clock.wrap(pipe.settle, "wait")), (pipe.ring, "send", clock.wrap(pipe.ring.send, "send")),
             (sch, "sample_lazy", clock.wrap(sch.sample_lazy, "python")), (sch, "read_tokens", clock.wrap(sch.read_tokens, "wait")),
             (sched, "step", ticking)]
    with ExitStack() as stack:
        for owner, name, f in parts:
            stack.enter_context(patched(owner, name, f))
        clock.t = time.perf_counter()
        run(sched, 1, max_tokens, prompt)
    return clock.line(f"ring-{pipe.ring.size}", ("python", "send", "encode", "wait"))


def counts(name: str, loop: Callable[[int], object], n: int = 32) -> str:
    """A decode step's host work, counted rather than timed (the same on a busy machine): Python
    function calls (cProfile's; MLX's own functions are not Python's) and the MLX operations in the
    graphs a step hands `mx.async_eval` (evaluated at once here, so no graph reaches into the last
    step's). Each is the difference between `loop` giving 2n + 1 and n + 1 tokens, over n: the
    prefill, the first token and the loop's start and end cancel."""
    calls, ops = [], []
    for tokens in (n + 1, 2 * n + 1):
        prof = cProfile.Profile()
        prof.runcall(loop, tokens)
        calls.append(pstats.Stats(prof).total_calls)
        found: list[int] = []

        def counted(*arrays):
            found.append(graph_ops(arrays))
            mx.eval(*arrays)

        with patched(mx, "async_eval", counted):
            loop(tokens)
        ops.append(sum(found))
    return f"{name}: a decode step: {(calls[1] - calls[0]) / n:.0f} Python calls, {(ops[1] - ops[0]) / n:.0f} MLX operations"


def graph_ops(arrays) -> int:
    """Operations (primitives) in the unevaluated graph of `arrays`, from MLX's DOT export."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "graph.dot"
        mx.export_to_dot(str(path), *arrays)
        return len(re.findall(r"shape=rectangle", path.read_text()))
