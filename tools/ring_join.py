"""A step bench's rank on the ring mlx.launch started: its slice joined (rank 0 gets the pipeline,
or tensor mode's lockstep; the others serve steps), and the decode trace each worker writes and
rank 0 collects.
"""

import json
import time
from pathlib import Path

from scheduler_run import run

from mlx_ring.planning.plan import plan_from_sizes, tensor_plan, uniform_plan
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.rendezvous import open_control
from mlx_ring.ring.timeline import between_pings
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.worker import serve_worker
from mlx_ring.ring.world import init_world, ring_description
from mlx_ring.serving.scheduler import Scheduler
from mlx_ring.tensor.lockstep import Lockstep
from mlx_ring.tensor.sums import sum_group
from mlx_ring.tensor.worker import serve_tensor
from shard import load_shard


def join_ring(
    model: Path, trace: Path | None, layers: str | None = None, tensor: bool = False
) -> Pipeline | Lockstep | None:
    """This rank's slice of `model` (an even split, or every layer's share with `tensor`, as the
    server's tensor mode runs it) on the ring started by mlx.launch: rank 0 gets the pipeline (or
    lockstep) to drive; the other ranks serve steps until shut down (then write their `trace`
    events, if asked) and get None."""
    world = init_world()
    n = spec_from_folder(model).n_layers
    if tensor:
        description = ring_description()
        sums = sum_group(world, description)
        shard = load_shard(model, tensor_plan(n, world.size()), world.rank(), sums)
        hosts = [f"rank{r}" for r in range(world.size())]
        ring = Ring(world, link=open_control(world, description, hosts, 60))
    else:
        sizes = [int(x) for x in layers.split(",")] if layers else None
        plan = plan_from_sizes(n, sizes) if sizes else uniform_plan(n, world.size())
        shard, ring = load_shard(model, plan, world.rank()), Ring(world)
    ring.trace = [] if trace else None
    if world.rank():
        (serve_tensor if shard.tensor else serve_worker)(shard, ring)
        if trace:  # whole or not at all: rank 0 reads it once it exists
            path = trace_file(trace, ring.rank)
            part = path.with_name(path.name + ".part")  # one a rank: they finish together
            part.write_text(json.dumps(ring.trace))
            part.replace(path)
        return None
    return Lockstep(shard, ring, sums) if tensor else Pipeline(shard, ring)


def trace_file(trace: Path, rank: int) -> Path:
    return trace.with_name(f"{trace.name}.rank{rank}")


def traced(sched: Scheduler, n: int, a) -> list:
    """Run n streams between two PING steps, shut the ring down and return every rank's events."""
    pipe = sched.pipe
    pipe.round_trip(Header(Kind.PING))
    run(sched, n, a.max_tokens, a.prompt_of)
    pipe.round_trip(Header(Kind.PING))
    return [between_pings(events) for events in collect_traces(pipe, a.trace)]


def collect_traces(pipe: Pipeline | Lockstep, trace: Path) -> list[list]:
    """Shut the ring down, then every rank's events, rank 0's first."""
    pipe.shutdown()
    ranks = [pipe.ring.trace]
    for r in range(1, pipe.ring.size):
        path, deadline = trace_file(trace, r), time.monotonic() + 30
        # written once that rank has shut down
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks.append(json.loads(path.read_text()))
        path.unlink()
    return ranks
