"""Entry point on every rank: `mlx.launch --backend ring --hostfile hosts.json server.py`.

Each rank loads its slice of layers. Rank 0 also holds the embedding and head, runs the engine on
its main thread (the one thread that owns MLX) and serves the OpenAI API from a process of its
own (mlx_ring/api/process.py), which never imports MLX.
The other ranks loop on the step protocol until told to shut down.
"""

import functools
import logging
import os
import sys
from pathlib import Path

from mlx_ring import exits, gpu

gpu.one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlx_ring.cache import kvbits, tiers
from mlx_ring.config import Config, parse_config
from mlx_ring.hostfile import control_address
from mlx_ring.hosts.identity import disagreement, identity
from mlx_ring.hosts.weights import find_slice, manifest, pieces_for
from mlx_ring.models.shape import read_shape
from mlx_ring.models.source import resolve_model
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cluster import Cluster, PlanFacts, Prediction, RankFacts
from mlx_ring.planning.plan import LayerPlan
from mlx_ring.planning.planner import plan_ring, read_config
from mlx_ring.planning.report import format_summary
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.platform import keep_awake
from mlx_ring.platform_disk import raise_open_files
from mlx_ring.ring.deadline import Deadlines
from mlx_ring.ring.frames import framed
from mlx_ring.ring.leftovers import drop_hostfile, note
from mlx_ring.ring.rendezvous import open_control
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.worker import serve_worker
from mlx_ring.ring.world import exchange, init_world, ring_description, world_backend
from mlx_ring.rundir import RunDir, log_as_rank
from mlx_ring.tensor.sums import sum_group
from mlx_ring.tensor.worker import serve_tensor
from shard import Shard, load_shard

log = logging.getLogger("server")


def setup_logging(cfg: Config, rank: int) -> None:
    """Every line carries rank and host; rank r also writes `logs/rank{r}.log`
    on its own machine."""
    log_as_rank(rank, cfg.log_dir, cfg.log_level)


def make_plan(
    cfg: Config, spec, world: mx.distributed.Group, model_path: Path, sums=None
) -> tuple[LayerPlan, list[Capabilities], dict]:
    """Every rank measures itself (cached per host), the ranks exchange what they found, and each
    computes the same plan from the model's sizes (weight headers only) in the mode PARALLEL
    gives or auto chooses (from the model's config: how its layers split; `sums()`: the group its
    all_sums would run over, else `world`); LAYERS= fixes the counts. Returns the plan, every
    rank's capabilities as planned with, and the plan's summary."""
    return plan_ring(cfg, spec, world, read_config(model_path), sums)


def gather_cluster(
    shard: Shard, world: mx.distributed.Group, predicted: dict | None = None
) -> Cluster:
    """Every rank's static facts (host, range, bytes held), gathered with one collective, plus the
    planner's view of each rank (capabilities, memory needed, predicted stage time)."""
    infos = exchange(shard.info(), world)
    # every rank computed the same prediction; it joins the facts each rank measured of itself
    views = predicted["ranks"] if predicted else [None] * len(infos)
    ranks = tuple(RankFacts.of(info, view) for info, view in zip(infos, views))
    plan = shard.plan
    return Cluster(
        ranks,
        PlanFacts(
            plan.strategy,
            plan.n_layers,
            tuple(map(tuple, plan.ranges)),
            Prediction.of(predicted) if predicted else None,
            plan.mode,
            plan.tensor,
        ),
    )


def serve_rank0(
    cfg: Config,
    shard: Shard,
    ring: Ring,
    model_path,
    spec,
    cluster: Cluster,
    caps: list[Capabilities],
) -> None:
    """Rank 0: its scheduler and engine, warmed up (serving/startup.py), then the API over them
    (api/serve.py) until the engine stops."""
    from mlx_ring.api.serve import serve, served_model
    from mlx_ring.ring.pipeline import Pipeline
    from mlx_ring.serving.startup import assemble
    from mlx_ring.tensor.lockstep import Lockstep

    pipe = Lockstep(shard, ring, shard.world) if shard.plan.tensor > 1 else Pipeline(shard, ring)
    rank0 = assemble(cfg, shard, pipe, model_path, spec, cluster, caps)
    hosts = [r.host for r in cluster.ranks]
    served = served_model(cfg, rank0, model_path)
    serve(cfg, rank0.engine, served, ring.size, shard.plan.describe(hosts))


def local_model(cfg: Config, rank: int) -> Path:
    """The slice the launcher sent this host for this rank under this plan
    (RING_MODEL_ID, RING_PLAN), whatever other slices the cache holds; else the model
    resolved here (rank 0's own machine)."""
    sizes = cfg.plan[1] if cfg.model_id and cfg.plan else ()
    # one stage (tensor mode, or one rank): every layer, or a share of each, and the ends
    if len(sizes) == 1:
        found = find_slice(cfg.cache_dir, cfg.model_id, pieces_for(range(sizes[0]), True))
    elif rank < len(sizes):
        start = sum(sizes[:rank])
        found = find_slice(
            cfg.cache_dir, cfg.model_id, pieces_for(range(start, start + sizes[rank]), rank == 0)
        )
    else:
        found = None
    if found:
        return found
    return resolve_model(cfg.model, cfg.cache_dir, cfg.weights)


def check_agreement(cfg: Config, model_path: Path, world: mx.distributed.Group) -> str:
    """Every rank serves the same model with the same code and versions, or none starts; returns
    the model's id."""
    model_id = manifest(model_path, cfg.cache_dir)["id"]
    if cfg.model_id and model_id != cfg.model_id:
        raise ValueError(
            f"this host's model {model_path} (id {model_id}) is not the one the launcher sent "
            f"(id {cfg.model_id}); start the ring with ./launch.sh"
        )
    problem = disagreement(exchange(identity(model_id), world))
    if problem:
        raise ValueError(problem)
    return model_id


def open_prompt_cache(cfg: Config, shard: Shard, model_id: str, model_path: Path) -> None:
    """This rank's side of the prompt cache: how it keeps its blocks (KV_BITS; ValueError where
    the model's heads cannot be quantized), the salt of their keys, and its disk tier."""
    if cfg.kv_bits and not shard.plain_kv:
        raise ValueError(
            "KV_BITS quantizes plain KV caches only; this model keeps sliding windows or fixed "
            "states in its blocks: set KV_BITS=0"
        )
    if cfg.kv_bits:
        shard.held.kv = kvbits.for_model(cfg.kv_bits, read_shape(read_config(model_path)))
    shard.held.salt = tiers.salt(model_id, cfg.prompt_cache_block, shard.held.kv)
    if shard.cacheable and (cfg.prompt_cache_gb != 0 or cfg.prompt_disk_gb != 0):
        shard.block = cfg.prompt_cache_block  # where a prefill notes its layers' states
    if not shard.cacheable or cfg.prompt_disk_gb == 0:
        return
    plan = shard.plan
    share = (shard.rank if plan.tensor > 1 else 0, plan.tensor)
    dtype = next(
        str(v.dtype)
        for _, v in tree_flatten(shard.model.parameters())
        if mx.issubdtype(v.dtype, mx.floating)
    )
    shard.held.disk = tiers.open_disk(cfg, shard.held.salt, (shard.start, shard.end), share, dtype)


def main() -> None:
    keep_awake(os.getpid())  # a Mac on default settings would idle to sleep under the ring
    raise_open_files()  # macOS's default of 256 is near what a ring and its cache hold open
    cfg, prepare_only = parse_config()
    # mlx.launch's temporary files, removed once this rank is gone
    note(RunDir(cfg.log_dir).tempfiles)
    world = init_world(cfg.ring_socket_buffer, cfg.ring_verbose)
    # tensor mode's NCCL group forms from it, after the file is gone
    description = ring_description()
    drop_hostfile()
    rank = world.rank()
    setup_logging(cfg, rank)
    model_path = local_model(cfg, rank)
    if prepare_only:
        print(model_path)
        return
    gpu.wire_memory()  # as mlx-lm does before it generates: before the weights load
    model_id = check_agreement(cfg, model_path, world)
    # the model's sizes, read once: for the plan and the prompt cache
    spec = spec_from_folder(model_path)
    # Tensor mode's all_sum group, formed where the planner first measures over it
    # or the shard loads.
    sums = functools.cache(lambda: sum_group(world, description))
    plan, caps, predicted = make_plan(cfg, spec, world, model_path, sums)
    if rank == 0:
        log.info("layer plan %s, %s mode:\n%s", plan.strategy, plan.mode, format_summary(predicted))
    shard = load_shard(model_path, plan, rank, sums() if plan.tensor > 1 else None)
    log.info(
        "loaded layers [%d, %d)%s from %s: %.1f MiB",
        shard.start,
        shard.end,
        f", a 1/{plan.tensor} share of each" if plan.tensor > 1 else "",
        model_path,
        shard.info()["parameter_bytes"] / 2**20,
    )
    open_prompt_cache(cfg, shard, model_id, model_path)
    cluster = gather_cluster(shard, world, predicted)
    # launch.sh's supervisor watches rank 0's pid: if rank 0 dies while another rank hangs, it
    # forces a restart.
    RunDir(cfg.log_dir).rank_pid(rank).write_text(str(os.getpid()))
    # JACCL gives a worker no sockets to wait on: its waits on its neighbours are
    # timed (ring/deadline.py).
    jaccl = world_backend() == "jaccl"
    deadlines = Deadlines(cfg.step_timeout) if jaccl and rank != 0 else None
    frame = framed(jaccl, cfg.ring_frames)
    hosts = [c.host for c in caps]
    # Sockets from rank 0 to every worker, whose beats name a silent host in seconds; tensor mode's
    # steps go on them too (through MLX, a CUDA rank's step waited for its GPU, and a wait in an
    # all_sum has no bound).
    many = world.size() > 1
    address = control_address(cfg.hostfile) if rank == 0 else None  # workers learn it from rank 0
    control = open_control(world, description, hosts, cfg.step_timeout, address) if many else None
    link = control if plan.tensor > 1 else None
    ring = Ring(world, cfg.receive_apart, deadlines, frame, hosts, link, control)
    if deadlines is not None:
        deadlines.start(cfg.drain_timeout)
    if ring.apart:
        log.info(
            "receiving %s payloads before building the stage on them (RECEIVE_APART%s)",
            " and ".join(sorted(k.name.lower() for k in ring.apart)),
            "=auto, on Metal" if cfg.receive_apart is None else "",
        )
    if rank == 0:
        serve_rank0(cfg, shard, ring, model_path, spec, cluster, caps)
    # until rank 0's shutdown step passes by, the ring breaks, or a SIGTERM and a silent predecessor
    else:
        serve = serve_tensor if shard.tensor else serve_worker
        serve(shard, ring, cfg.drain_timeout, cfg.step_timeout)
    if shard.held.disk is not None:
        shard.held.disk.close()  # the blocks still queued, within a bound
    log.info("exiting")


if __name__ == "__main__":
    try:
        main()
    # configuration errors: one clear line, no traceback; launch.sh does not retry
    except ValueError as e:
        logging.getLogger("server").error("%s", exits.refusal(str(e)))
        sys.exit(exits.REFUSED)
    # a worker's step, or a start-up's: the GPU failed, and what it computed is lost
    except Exception as e:
        if not gpu.is_device_failure(e):
            raise
        gpu.end_rank(e)
