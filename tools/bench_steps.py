"""Drive the real scheduler on the ring without HTTP: how many steps of each kind, and how long, it
takes N concurrent greedy sequences to produce their tokens. Run it under mlx.launch like the
server:

    python tools/fed.py mlx.launch --backend ring --hostfile hosts.json -- \\
        python tools/bench_steps.py --model DIR --streams 1,16,64
    (tools/fed.py feeds mlx.launch's stdin, on which it would otherwise spin cores the ranks need)
    (add CUDA_PER_RANK=1 to the environment on a multi-GPU host; --profile prints rank 0's cProfile;
    --trace FILE prints where a decode step's time goes on each rank, ranks on one host only)

With --draft-tokens K (and --draft-model DIR, else prompt lookup), each line is timed in --rounds
alternating pairs, plain then drafting, in the same processes: the cost or gain of drafting without
the run-to-run drift of separate servers. With --peers (one rank), each line alternates the ring's
scheduler with mlx-lm's own loop (tools/mlx_lm_loop.py) on a second copy of the model, likewise;
--split then times one stream's step by its parts (Python, MLX encoding, the wait for the token), as
`split_ring` and `split_generate_step` below do (bench_tensor.py's --split too).
"""

import argparse
import cProfile
import itertools
import json
import pstats
import statistics
import sys
import time
import zlib
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
import mlx_lm_loop  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.utils import load_model, load_tokenizer  # noqa: E402

from mlx_ring.planning.plan import plan_from_sizes, uniform_plan  # noqa: E402
from mlx_ring.planning.sizes import spec_from_folder  # noqa: E402
from mlx_ring.ring.pipeline import Pipeline  # noqa: E402
from mlx_ring.ring.protocol import Header, Kind  # noqa: E402
from mlx_ring.ring.timeline import between_pings, decode_times, summary  # noqa: E402
from mlx_ring.ring.transport import Ring  # noqa: E402
from mlx_ring.ring.worker import serve_worker  # noqa: E402
from mlx_ring.ring.world import init_world  # noqa: E402
from mlx_ring.serving import runner  # noqa: E402
from mlx_ring.serving.params import SamplingParams  # noqa: E402
from mlx_ring.serving.prefix import PrefixIndex  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler, Sequence  # noqa: E402
from shard import load_shard  # noqa: E402


def run(
    sched: Scheduler, n: int, max_tokens: int, prompt: Callable[[int], list[int]]
) -> tuple[float, str]:
    """n sequences arriving together; returns the seconds until the last one had its last token
    (as mlx_lm_loop times mlx-lm's loops) and one line of counts and times. What the scheduler
    does after that (the step chained past the last token, the FILTER that frees the group) runs
    untimed, as the step mlx-lm's loop starts past its last token does."""
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
    seqs = [Sequence(i, prompt(i), SamplingParams(temperature=0.0)) for i in range(n)]
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


def draft_ab(sched: Scheduler, n: int, a) -> None:
    """Plain and drafting runs in turn; each line's tokens/s, then the drafting/plain ratio of
    the sums."""
    k, totals = sched.draft_tokens, {0: 0.0, 1: 0.0}
    for r in range(a.rounds):
        for drafting in (0, 1):
            sched.draft_tokens = k if drafting else 0
            before = (sched.drafted, sched.accepted)
            seconds, line = run(sched, n, a.max_tokens, a.prompt_of)
            totals[drafting] += seconds
            kept = (
                f", drafts kept {sched.accepted - before[1]}/{sched.drafted - before[0]}"
                if drafting
                else ""
            )
            print(f"round {r} {'drafting' if drafting else 'plain'}: {line}{kept}", flush=True)
    sched.draft_tokens = k
    print(
        (
            f"{n} streams, {a.rounds} rounds: drafting took {totals[1] / totals[0]:.3f}x the "
            "time of plain decoding"
        ),
        flush=True,
    )


def peer_ab(sched: Scheduler, model, n: int, a) -> None:
    """The ring's scheduler and mlx-lm's own loop (`generate_step` for one stream,
    `BatchGenerator` for several) in turn, --rounds times, in this process; then the min and
    median of ring/mlx-lm."""
    times: dict[str, list[float]] = {"ring": [], "mlx_lm": []}
    for r in range(a.rounds):
        seconds, line = run(sched, n, a.max_tokens, a.prompt_of)
        times["ring"].append(seconds)
        print(f"round {r} ring-{sched.pipe.ring.size}: {line}", flush=True)
        seconds, line = (
            mlx_lm_loop.one_stream(model, a.prompt_of(0), a.max_tokens)
            if n == 1
            else mlx_lm_loop.many_streams(model, n, a.max_tokens, a.prompt_of)
        )
        times["mlx_lm"].append(seconds)
        print(f"round {r} {line}", flush=True)
    # speed: ring over mlx-lm
    ratios = sorted(p / q for p, q in zip(times["mlx_lm"], times["ring"]))
    print(
        f"{n} streams, {a.rounds} rounds: ring/mlx-lm speed min {ratios[0]:.3f}, median "
        f"{statistics.median(ratios):.3f}, max {ratios[-1]:.3f}",
        flush=True,
    )


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


def split_generate_step(model, prompt: list[int], max_tokens: int) -> str:
    """mlx-lm's loop: python = the model's forward built (its sampler is one argmax), encode =
    `mx.async_eval`, wait = the rest of the step (the token read and the loop)."""
    clock = Clock()
    with patched(mx, "async_eval", clock.wrap(mx.async_eval, "encode")):
        steps = generate_step(
            mx.array(prompt), Timed(model, clock), max_tokens=max_tokens, sampler=mlx_lm_loop.GREEDY
        )
        for _ in steps:
            clock.tick()
    return clock.line("generate_step", ("python", "encode"))


def split_ring(sched: Scheduler, max_tokens: int, prompt: Callable[[int], list[int]]) -> str:
    """The ring's scheduler, one stream: python = the stage, head and sampling built (`Shard.apply`,
    `head`, `sample_lazy`), send = the step's header (and payload) leaving on the ring, encode = the
    rest of `submit` (its `async_eval`) and the head's prefetch, wait = `read_tokens` and (in tensor
    mode) the wait for the last step inside `submit`."""
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
        run(sched, 1, max_tokens, prompt)
    return clock.line(f"ring-{pipe.ring.size}", ("python", "send", "encode", "wait"))


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


def join_ring(model: Path, trace: Path | None, layers: str | None = None) -> Pipeline | None:
    """This rank's slice of `model` (an even split) on the ring started by mlx.launch: rank 0 gets
    the pipeline to drive; the other ranks serve steps until shut down (then write their `trace`
    events, if asked) and get None."""
    world = init_world()
    n = spec_from_folder(model).n_layers
    plan = (
        plan_from_sizes(n, [int(x) for x in layers.split(",")])
        if layers
        else uniform_plan(n, world.size())
    )
    shard = load_shard(model, plan, world.rank())
    ring = Ring(world)
    ring.trace = [] if trace else None
    if world.rank():
        serve_worker(shard, ring)
        if trace:  # whole or not at all: rank 0 reads it once it exists
            path = trace_file(trace, ring.rank)
            part = path.with_name(path.name + ".part")  # one a rank: they finish together
            part.write_text(json.dumps(ring.trace))
            part.replace(path)
        return None
    return Pipeline(shard, ring)


def trace_file(trace: Path, rank: int) -> Path:
    return trace.with_name(f"{trace.name}.rank{rank}")


def traced(sched: Scheduler, n: int, a) -> list:
    """Run n streams between two PING steps, shut the ring down and return every rank's events."""
    pipe = sched.pipe
    pipe.round_trip(Header(Kind.PING))
    run(sched, n, a.max_tokens, a.prompt_of)
    pipe.round_trip(Header(Kind.PING))
    pipe.shutdown()
    ranks = [pipe.ring.trace]
    for r in range(1, pipe.ring.size):
        path, deadline = trace_file(a.trace, r), time.monotonic() + 30
        # written once that rank has shut down
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks.append(json.loads(path.read_text()))
        path.unlink()
    return [between_pings(events) for events in ranks]


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=25)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument(
        "--groups", type=int, default=0, help="decode groups (micro-batches; 0: one per rank)"
    )
    p.add_argument(
        "--layers", default=None, help="layers per rank, e.g. 11,19 (default: an even split)"
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="time each rank's part of the decode steps of the last "
        "stream count (2 or more ranks on one host); the events go to this JSON file",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=0,
        help="A/B drafting (up to K tokens) against plain decoding",
    )
    p.add_argument(
        "--draft-model", type=Path, default=None, help="draft with this model (else prompt lookup)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--prompt",
        default=None,
        help="a user message for every stream (else token ids that mean nothing); "
        "{n} in it becomes a number new to each request",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="one rank: mlx-lm's own loop in turn with the ring's, --rounds "
        "times (generate_step for one stream, BatchGenerator for several; a "
        "second copy of the model)",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="one stream's decode step split into Python, MLX encoding and "
        "the wait for the token, for the ring and, with --peers, generate_step",
    )
    p.add_argument(
        "--prompt-cache",
        type=int,
        default=0,
        help="prompt cache of this many tokens, as the server keeps (0: off)",
    )
    p.add_argument(
        "--prefill-budget",
        type=int,
        default=0,
        help="prompt tokens on the ring at once, as the server's plan grants (0: no bound)",
    )
    p.add_argument(
        "--prefill-step",
        type=int,
        default=0,
        help="prompt tokens of one prefill step (rows x chunk; 0: one "
        "chunk), as the server's plan grants a CUDA device",
    )
    a = p.parse_args()
    a.prompt_of = prompts(a)
    pipe = join_ring(a.model, a.trace, a.layers)
    if pipe is None:
        return
    shard = pipe.stage
    drafter = load_model(a.draft_model)[0] if a.draft_model else None
    prefix = PrefixIndex(a.prompt_cache) if a.prompt_cache else None
    sched = Scheduler(
        pipe,
        shard,
        groups=a.groups,
        chunk=a.chunk,
        prefix=prefix,
        draft_tokens=a.draft_tokens,
        draft_model=drafter,
        prefill_budget=a.prefill_budget,
        prefill_step=a.prefill_step,
    )
    streams = [int(x) for x in a.streams.split(",")]
    if a.peers and pipe.ring.size > 1:
        raise SystemExit("--peers runs mlx-lm's loop beside a ring of one rank")
    peer = load_model(a.model)[0] if a.peers else None
    for n in streams:  # warm-up: kernels compile for each new shape on CUDA
        run(sched, n, 4, a.prompt_of)
        if peer is not None:
            mlx_lm_loop.one_stream(peer, a.prompt_of(0), 4) if n == 1 else mlx_lm_loop.many_streams(
                peer, n, 4, a.prompt_of
            )
    for n in streams:
        if peer is not None:
            peer_ab(sched, peer, n, a)
        elif a.draft_tokens:
            draft_ab(sched, n, a)
        else:
            print(
                f"{pipe.ring.size} rank(s):",
                run(sched, n, a.max_tokens, a.prompt_of)[1],
                flush=True,
            )
    for _ in range(a.rounds if a.split else 0):
        print(split_ring(sched, a.max_tokens, a.prompt_of), flush=True)
        if peer is not None:
            print(split_generate_step(peer, a.prompt_of(0), a.max_tokens), flush=True)
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(run, sched, max(streams), a.max_tokens, a.prompt_of)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    if a.trace and pipe.ring.size > 1:
        ranks = traced(sched, streams[-1], a)
        a.trace.write_text(json.dumps(ranks))
        print(
            f"{pipe.ring.size} rank(s), {streams[-1]} streams:",
            summary(decode_times(ranks)),
            flush=True,
        )
    else:
        pipe.shutdown()


if __name__ == "__main__":
    main()
