"""mlx-lm's own decode loops, without HTTP, timed as `bench_steps.py` times the ring's scheduler:
`generate_step` for one stream (mlx-lm's single-stream loop, which builds the next step while the
device runs this one) and `BatchGenerator` for many (mlx-lm's continuous batching). Both greedy,
so their tokens can be compared with the ring's. Imported by `bench_steps.py --peers`."""

import json
import time
import zlib
from typing import Callable

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step, generation_stream
from mlx_lm.sample_utils import make_sampler

GREEDY = make_sampler(0.0)


def line(
    name: str, n: int, max_tokens: int, t0: float, first: float, last: float, tokens: dict
) -> tuple[float, str]:
    """The figures `scheduler_run.run` prints for the ring, in the same shape."""
    dt = last - t0
    digest = zlib.crc32(json.dumps([tokens[i] for i in range(n)]).encode())
    decode = n * (max_tokens - 1) / (last - first) if max_tokens > 1 else 0.0
    return dt, (
        f"{name}: {n} streams: {dt:.2f} s, {n * max_tokens / dt:.1f} tokens/s, first token "
        f"{first - t0:.2f} s, decode {decode:.1f} tokens/s, tokens {digest:08x}"
    )


def one_stream(
    model, prompt: list[int], max_tokens: int, sampler=GREEDY, processors=None
) -> tuple[float, str]:
    """mlx-lm's `generate_step`, one stream of `max_tokens` tokens (greedy, unless `sampler` and
    `processors`, mlx-lm's own, say other)."""
    t0, first, out = time.perf_counter(), None, []
    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors,
    )
    for token, _ in steps:
        first = first or time.perf_counter()
        out.append(int(token))
    last = time.perf_counter()
    # the step it started past the last token, untimed (as the ring's)
    mx.synchronize(generation_stream)
    return line("generate_step", 1, max_tokens, t0, first, last, {0: out})


def many_streams(
    model, n: int, max_tokens: int, prompt: Callable[[int], list[int]]
) -> tuple[float, str]:
    """mlx-lm's `BatchGenerator`: n greedy streams arriving together, each `max_tokens`
    tokens, every prompt in one prefill batch and every stream in one decode batch (as
    the ring's one group)."""
    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        sampler=GREEDY,
        completion_batch_size=max(n, 32),
        prefill_batch_size=n,
    )
    t0, first = time.perf_counter(), None
    uids = gen.insert([prompt(i) for i in range(n)], [max_tokens] * n)
    row = {uid: i for i, uid in enumerate(uids)}
    tokens: dict[int, list[int]] = {i: [] for i in range(n)}
    done = 0
    while done < n:
        for r in gen.next_generated():
            first = first or time.perf_counter()
            tokens[row[r.uid]].append(int(r.token))
            done += r.finish_reason is not None
    last = time.perf_counter()
    gen.close()
    # whatever it started past the last tokens, untimed (as the ring's)
    mx.synchronize(generation_stream)
    return line("BatchGenerator", n, max_tokens, t0, first, last, tokens)
