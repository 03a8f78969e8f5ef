"""Rank 0's warm-up before it serves: the steps first requests would run (a prefill, decode at the
batch sizes a GPU builds kernels for), so no client waits for MLX to build them."""

import itertools
import time

import mlx.core as mx

from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler
from mlx_ring.serving.rows import Sequence


def warm_rows(max_active: int) -> list[int]:
    """How many sequences each warm-up round runs at once: 1, 2, 4, ... up to `max_active` on a GPU,
    whose kernels are built on first use; 1 on a CPU, where only the first request's own work is new."""
    if mx.default_device() == mx.cpu:
        return [1]
    return [n for n in (2**k for k in range(12)) if n < max_active] + [max_active]


def warm_up(sched: Scheduler, ids: itertools.count, prompt: list[int], rows: list[int], tokens: int = 2) -> float:
    """Run `rows[i]` greedy sequences of `prompt` at once, `tokens` tokens each, round by round, on
    every rank; returns the seconds it took. Nothing is left behind: not a cache row, not an entry
    in the prompt cache."""
    t0, prefix = time.perf_counter(), sched.prefix
    sched.prefix = None  # the prompt cache keeps nothing of them
    try:
        for n in rows:
            count = {s: 0 for s in (Sequence(next(ids), list(prompt), SamplingParams(temperature=0.0)) for _ in range(n))}
            for s in count:
                sched.add(s)
            while not sched.idle():
                for s, _ in sched.step():
                    count[s] += 1
                    if count[s] >= tokens:
                        sched.remove(s)
    finally:
        sched.prefix = prefix
    return time.perf_counter() - t0
