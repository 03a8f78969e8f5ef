"""A step bench's rank on the ring mlx.launch started: its slice joined (rank 0 gets the pipeline,
the others serve steps), and the decode trace each worker writes and rank 0 collects.
"""

import json
import time
from pathlib import Path

from scheduler_run import run

from mlx_ring.planning.plan import plan_from_sizes, uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.timeline import between_pings
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.worker import serve_worker
from mlx_ring.ring.world import init_world
from mlx_ring.serving.scheduler import Scheduler
from mlx_ring.tensor.worker import serve_tensor
from shard import load_shard


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
        (serve_tensor if shard.tensor else serve_worker)(shard, ring)
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
