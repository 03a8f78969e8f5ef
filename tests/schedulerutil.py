"""Driving a scheduler in process, step by step, as rank 0's engine does: the
unit tests' shared loop."""

from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler, Sequence


def decode_all(
    sched: Scheduler, prompts: list[list[int]], wanted: list[int]
) -> dict[int, list[int]]:
    """Greedy tokens of each prompt (by index), each sequence leaving once it has its `wanted`."""
    seqs = [Sequence(i, p, SamplingParams(temperature=0.0)) for i, p in enumerate(prompts)]
    got = {s.id: [] for s in seqs}
    for s in seqs:
        sched.add(s)
    while not sched.idle():
        for s, token in sched.step():
            got[s.id].append(token.id)
            if len(got[s.id]) == wanted[s.id]:
                sched.remove(s)
    return got
