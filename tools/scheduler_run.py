"""N streams (greedy, or as asked) through the ring's real scheduler, their steps counted and
timed (`run`, as bench_steps.py and bench_tensor.py print it), and each stream's prompt ids.
"""

import itertools
import json
import statistics
import time
import zlib
from typing import Callable

from mlx_lm.utils import load_tokenizer

from mlx_ring.ring.protocol import Kind
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler, Sequence

GREEDY = SamplingParams(temperature=0.0)


def run(
    sched: Scheduler,
    n: int,
    max_tokens: int,
    prompt: Callable[[int], list[int]],
    params: SamplingParams = GREEDY,
) -> tuple[float, str]:
    """n sequences arriving together, each sampled as `params` say; returns the seconds until the
    last one had its last token (as mlx_lm_loop times mlx-lm's loops) and one line of counts and
    times. What the scheduler does after that (the step chained past the last token, the FILTER
    that frees the group) runs untimed, as the step mlx-lm's loop starts past its last token
    does."""
    kinds: dict[int, int] = {}
    shapes: dict[tuple[int, int], int] = {}  # PREFILL steps by (rows, tokens a row)
    pipe = sched.pipe
    submit = pipe.submit

    def counted(header, payload, *a, **kw):
        # names after the timing: Kind() costs a step
        kinds[header.kind] = kinds.get(header.kind, 0) + 1
        if header.kind == Kind.PREFILL:
            shapes[payload.shape] = shapes.get(payload.shape, 0) + 1
        submit(header, payload, *a, **kw)

    pipe.submit = counted
    seqs = [Sequence(i, prompt(i), params) for i in range(n)]
    count = dict.fromkeys(range(n), 0)
    tokens: dict[int, list[int]] = {i: [] for i in range(n)}
    t0, first, last, finished = time.perf_counter(), None, None, 0
    firsts: list[float] = []  # each stream's first token
    for s in seqs:
        sched.add(s)
    while not sched.idle():
        for s, tok in sched.step():
            first = first or time.perf_counter()
            if not count[s.id]:
                firsts.append(time.perf_counter() - t0)
            count[s.id] += 1
            tokens[s.id].append(getattr(tok, "id", -1))
            if count[s.id] >= max_tokens:
                sched.remove(s)
                finished += 1
                if finished == n:
                    last = time.perf_counter()
    pipe.submit = submit
    kinds = {Kind(k).name: v for k, v in kinds.items()}
    dt = last - t0
    # to compare ring sizes (where they batch alike)
    digest = zlib.crc32(json.dumps([tokens[i] for i in range(n)]).encode())
    # after every stream's first token
    decode = n * (max_tokens - 1) / (last - first) if max_tokens > 1 else 0.0
    return dt, (
        f"{n} streams: {dt:.2f} s, {n * max_tokens / dt:.1f} tokens/s, first token "
        f"{first - t0:.2f} s (mean {statistics.mean(firsts):.2f} s), decode {decode:.1f} tokens/s, "
        f"steps {kinds}, prefill rows x tokens {shapes}, tokens {digest:08x}"
    )


def prompts(a) -> Callable[[int], list[int]]:
    """Stream i's prompt ids: `--prompt` in the chat template, its "{n}" a number new to each
    request (as bench.py numbers its requests: they share the template's start, not a whole
    prompt), else `--prompt-len` ids that mean nothing."""
    if not a.prompt:
        return lambda i: [(7 * i + j) % 30000 + 100 for j in range(a.prompt_len)]
    template, numbers = load_tokenizer(a.model).apply_chat_template, itertools.count()
    return lambda i: template(
        [{"role": "user", "content": a.prompt.replace("{n}", str(next(numbers)))}],
        add_generation_prompt=True,
    )
