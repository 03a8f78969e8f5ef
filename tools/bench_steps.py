"""Drive the real scheduler on the ring without HTTP: how many steps of each kind, and how long, it
takes N concurrent greedy sequences to produce their tokens. Run it under mlx.launch like the server:

    mlx.launch --backend ring --hostfile hosts.json -- python tools/bench_steps.py --model DIR --streams 1,16,64
    (add CUDA_PER_RANK=1 to the environment on a multi-GPU host; --profile prints rank 0's cProfile)
"""

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

from mlx_ring.planning.plan import uniform_plan  # noqa: E402
from mlx_ring.planning.sizes import spec_from_folder  # noqa: E402
from mlx_ring.ring.pipeline import Pipeline  # noqa: E402
from mlx_ring.ring.protocol import Kind  # noqa: E402
from mlx_ring.ring.transport import Ring, init_world  # noqa: E402
from mlx_ring.serving.params import SamplingParams  # noqa: E402
from mlx_ring.serving.scheduler import Scheduler, Sequence  # noqa: E402
from shard import load_shard, serve_worker  # noqa: E402


def run(sched: Scheduler, n: int, max_tokens: int, prompt_len: int) -> str:
    """n sequences arriving together; returns one line of counts and times."""
    kinds: dict[str, int] = {}
    pipe = sched.pipe
    submit = pipe.submit

    def counted(header, payload, tag=None, chained=False):
        kinds[Kind(header.kind).name] = kinds.get(Kind(header.kind).name, 0) + 1
        submit(header, payload, tag, chained)

    pipe.submit = counted
    seqs = [Sequence(i, [(7 * i + j) % 30000 + 100 for j in range(prompt_len)], SamplingParams(temperature=0.0))
            for i in range(n)]
    count = dict.fromkeys(range(n), 0)
    t0, first = time.perf_counter(), None
    for s in seqs:
        sched.add(s)
    while not sched.idle():
        for s, _ in sched.step():
            first = first or time.perf_counter()
            count[s.id] += 1
            if count[s.id] >= max_tokens:
                sched.remove(s)
    pipe.submit = submit
    dt = time.perf_counter() - t0
    return f"{n} streams: {dt:.2f} s, {n * max_tokens / dt:.0f} tokens/s, first token {first - t0:.2f} s, steps {kinds}"


def join_ring(model: Path) -> Pipeline | None:
    """This rank's slice of `model` (an even split) on the ring started by mlx.launch: rank 0 gets
    the pipeline to drive; the other ranks serve steps until shut down, then get None."""
    world = init_world()
    shard = load_shard(model, uniform_plan(spec_from_folder(model).n_layers, world.size()), world.rank())
    ring = Ring(world)
    if world.rank():
        return serve_worker(shard, ring)
    return Pipeline(shard, ring)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="MLX model folder")
    p.add_argument("--streams", default="1,16,64")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=25)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    pipe = join_ring(a.model)
    if pipe is None:
        return
    shard = pipe.stage
    sched = Scheduler(pipe, shard, chunk=a.chunk)
    streams = [int(x) for x in a.streams.split(",")]
    for n in streams:  # warm-up: kernels compile for each new shape on CUDA
        run(sched, n, 4, a.prompt_len)
    for n in streams:
        print(f"{pipe.ring.size} rank(s):", run(sched, n, a.max_tokens, a.prompt_len), flush=True)
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(run, sched, max(streams), a.max_tokens, a.prompt_len)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    pipe.shutdown()


if __name__ == "__main__":
    main()
