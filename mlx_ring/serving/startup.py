"""Rank 0's assembly before it serves: the prefill-chunk size, the prompt-cache budget, the draft
model, the scheduler and engine around the ring, the warm-up, and the KV room the warm-up leaves."""

import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_config, load_model, load_tokenizer

from mlx_ring import gpu
from mlx_ring.cache.blocks import BlockIndex
from mlx_ring.cache.tiers import block_index
from mlx_ring.config import Config
from mlx_ring.models.source import resolve_model
from mlx_ring.models.support import UNBATCHED
from mlx_ring.planning.activations import least_step_tokens, prefill_step
from mlx_ring.planning.assemble import serving
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cluster import Cluster
from mlx_ring.planning.growth import GROUP_SPARE_TOKENS
from mlx_ring.planning.planner import dtype_of
from mlx_ring.planning.report import format_summary
from mlx_ring.planning.sizes import DTYPE_BYTES
from mlx_ring.ring.handle import RingHandle
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.grammar import Grammars
from mlx_ring.serving.scheduler import Scheduler
from mlx_ring.serving.warmup import count_measured, decode_groups, fit_room, warm
from mlx_ring.tensor.lockstep import Lockstep
from mlx_ring.tensor.sums import nccl_sums

log = logging.getLogger("server")


@dataclass
class Rank0:
    """What rank 0 serves with, warmed up: the engine, the tokenizer, the model's config and
    head, and the KV room (tokens every rank holds at once; None: no bound)."""

    engine: Engine
    tokenizer: object  # mlx_lm TokenizerWrapper
    config: dict  # the model's config.json
    grammars: Grammars
    vocab: int  # the head's logits per token
    dtype: mx.Dtype  # the type the head computes in
    cluster: Cluster
    kv_room: int | None


def prefill_chunk(cfg: Config, cluster: Cluster, layer_flops: float) -> int:
    """PREFILL_CHUNK, else by device: the engine takes in requests and cancellations only
    between steps, and 512 prompt tokens take seconds on a CPU (milliseconds on a big GPU).
    Fewer where a Mac's stage of a chunk would near Metal's watchdog (`gpu.watchdog_chunk`),
    from each Mac's measured speed (`cluster`: ranks with a recommended working set) and a
    layer's FLOPs per token."""
    if cfg.prefill_chunk:
        return cfg.prefill_chunk
    cap = 128 if mx.default_device() == mx.cpu else 512
    share = cluster.plan.tensor  # a tensor rank computes its share of each layer
    macs = [
        (r.host, (r.layers[1] - r.layers[0]) * layer_flops / share, r.planned.tflops)
        for r in cluster.ranks
        if r.planned and r.planned.working_set_gb
    ]
    if not macs:
        return cap
    chunk = gpu.watchdog_chunk(macs, cap)
    log.info(
        "prefill chunks of %d tokens: the busiest Mac's stage of one stays within %.0f s (Metal's "
        "watchdog aborts at about %.0f s); PREFILL_CHUNK sets it",
        chunk,
        gpu.STAGE_BUDGET_S,
        gpu.WATCHDOG_S,
    )
    return chunk


def prompt_cache(cfg: Config, shard, spec, cluster: Cluster) -> BlockIndex | None:
    """Rank 0's prompt-cache index. Every rank holds a block's tokens for its own layers, in RAM
    within the memory the plan set aside for it (planning/promptcache.py: out of what the plan
    leaves it, at most PROMPT_CACHE_GB): the budget in tokens is what the tightest rank holds, a
    block of a model with fixed states (a convolution's, an SSM's) counting them as tokens of as
    many bytes; behind it, rank 0's own disk tier. None when both tiers are off or when no block
    can keep the model's caches."""
    disk = shard.held.disk
    unknown = [r.rank for r in cluster.ranks if r.state_bytes < 0]
    ram = cfg.prompt_cache_gb != 0  # None: auto
    if not (ram or disk) or not shard.cacheable or unknown:
        if ram or disk:
            log.info(
                "prompt cache off: %s",
                f"the fixed states of rank {unknown[0]}'s layers cannot be sized"
                if unknown and shard.cacheable
                else "this model's caches cannot be kept in blocks",
            )
        return None
    # one layer's, as its blocks keep it (KV_BITS: fewer bytes, so more tokens in the same GB)
    per_token = spec.kv_bytes_per_token * shard.held.kv.share(DTYPE_BYTES[dtype_of(spec)])
    kept = [
        (cfg.prompt_cache_gb or 0.0)  # no plan: the setting (auto: none)
        if r.planned is None or r.planned.prompt_cache_gb is None
        else r.planned.prompt_cache_gb
        for r in cluster.ranks
    ]
    plan, block = shard.plan, cfg.prompt_cache_block  # tensor mode: a share of each layer's heads
    budget = min(
        int(
            gb
            * 2**30
            / (per_token * len(plan.layers_of(r)) / plan.tensor + facts.state_bytes / block)
        )
        for r, (gb, facts) in enumerate(zip(kept, cluster.ranks))
    )
    log.info(
        "prompt cache: %s GB of RAM on the ranks, %d tokens in blocks of %d%s%s%s",
        "/".join(f"{gb:.3g}" for gb in kept),
        budget,
        block,
        "" if shard.plain_kv else " (whole blocks: each keeps its layers' states at its end)",
        f" kept at {shard.held.kv.bits} bits (KV_BITS)" if shard.held.kv.bits else "",
        ", and each rank's disk" if disk is not None else "",
    )
    return block_index(budget, shard.held.salt, block, disk, whole=not shard.plain_kv)


def draft_model(cfg: Config, vocab: int):
    """DRAFT_MODEL, loaded whole on rank 0, or None; it must give logits
    over the same vocabulary."""
    if not cfg.draft_model:
        return None
    path = resolve_model(cfg.draft_model, cfg.cache_dir, cfg.weights)
    model, _ = load_model(path)
    rows = model(mx.array([[0]])).shape[-1]  # only the shape is read: nothing computed
    if rows != vocab:
        raise ValueError(
            f"DRAFT_MODEL {cfg.draft_model} gives logits over {rows} tokens, the model over "
            f"{vocab}; a draft model must share the model's tokenizer (pick one of the same family)"
        )
    log.info("drafts from %s, up to %d tokens a step", path.name, cfg.draft_tokens)
    return model


def assemble(
    cfg: Config,
    shard,
    pipe: RingHandle,
    model_path: Path,
    spec,
    cluster: Cluster,
    caps: list[Capabilities],
) -> Rank0:
    """Rank 0's scheduler and engine on `pipe` (the ring as rank 0 drives it), warmed up; `shard`:
    rank 0's slice (`shard.Shard`: the ends of the model and its layers)."""
    kv_room = cluster.kv_room  # token-rows of KV cache every rank has room for
    if kv_room is not None:
        log.info(
            "KV cache: room for %d tokens at once on every rank (the plan keeps %d: KV_TOKENS); "
            "requests wait for room",
            kv_room,
            cluster.plan.prediction.kv_tokens,
        )
    model_config = load_config(model_path)
    tokenizer = load_tokenizer(model_path, eos_token_ids=model_config.get("eos_token_id"))
    # (1, 1, V): only its shape is read, nothing computed
    logits = shard.head(shard.embed(mx.array([[0]])))
    grammars = Grammars(tokenizer, logits.shape[-1])
    groups, why = decode_groups(cfg.groups, caps, shard.batches)
    if shard.tensor and not cfg.groups:
        groups, why = 1, "tensor mode: every rank works on every group"
    log.info(
        "decode groups: %d (%s)", groups, why if cfg.groups else f"{why}; GROUPS sets the number"
    )
    if not shard.batches:
        log.info(
            "batching off (%s): each of the %d decode groups (GROUPS) serves one request at a time",
            UNBATCHED[model_config["model_type"]],
            groups,
        )
    if cfg.draft_tokens and not shard.plain_kv:
        log.info("speculative decoding off: this model's caches cannot drop rejected drafts")
    chunk = prefill_chunk(cfg, cluster, spec.layer_flops)
    # The plan counts each rank's activations for `step_tokens` (activations.py): one prefill step
    # holds at most the fewest any rank may, and a pipeline's prefill steps out are each on another
    # stage, so each stage may hold a step's worth; in tensor mode every rank holds every step.
    served, plan = serving(spec, cfg.prefill_chunk, cfg.max_active), shard.plan
    layers = [len(plan.layers_of(r)) for r in range(plan.size)]
    step = prefill_step(served, caps, layers, cfg.kv_tokens, chunk)
    budget = max(step, least_step_tokens(served, caps, layers, cfg.kv_tokens))
    sched = Scheduler(
        pipe,
        shard,
        groups=groups,
        chunk=chunk,
        prefix=prompt_cache(cfg, shard, spec, cluster),
        draft_tokens=cfg.draft_tokens if shard.plain_kv else 0,
        draft_model=draft_model(cfg, logits.shape[-1]) if shard.plain_kv else None,
        kv_room=max(1, kv_room) if kv_room is not None else 0,
        kv_spare=GROUP_SPARE_TOKENS,
        prefill_budget=budget * len(plan.ranges),
        prefill_step=step,
    )
    log.info(
        "prefill: steps of up to %d prompt tokens (rows x %d-token chunks), %d on the ring at once",
        step,
        chunk,
        budget * len(plan.ranges),
    )
    engine = Engine(
        sched,
        tokenizer,
        max_queue=cfg.max_queue,
        max_active=cfg.max_active,
        step_timeout=cfg.step_timeout,
        drain_timeout=cfg.drain_timeout,
        constrain=grammars.processor,
    )
    engine.peers = ", ".join(f"{r.rank} on {r.host}" for r in cluster.ranks[1:])
    # a rank gone mid-step: fail the requests now, naming it (off the engine's thread)

    def lost(why: str) -> None:
        threading.Thread(target=engine.fail, args=(why,), daemon=True).start()

    if isinstance(pipe, Lockstep):
        pipe.watch_peers(lost)
    if (control := getattr(pipe.ring, "control", None)) is not None:
        control.watch(lost)  # the workers' beats: one gone or stuck, named by its host
        engine.stuck = control.stuck
    hello = (
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hello"}], add_generation_prompt=True
        )
        if getattr(tokenizer, "chat_template", None)
        else tokenizer.encode("Hello")
    )
    status = warm(
        sched,
        engine.seq_ids,
        hello,
        cfg.max_active,
        chunk,
        may_regroup=not cfg.groups and shard.batches and not shard.tensor,
        nccl=shard.tensor and nccl_sums(plan.size),
        constrain=grammars.processor,
    )
    # what the warm-up's activations took beyond the plan's runtime comes out of the room
    if kv_room is not None:
        kv_room = fit_room(spec, cluster.ranks, status, kv_room, cluster.plan.prediction.kv_tokens)
        cluster = cluster.with_kv_room(kv_room)
        sched.kv_room = max(1, kv_room)
    # the plan's figures, now counting what the warm-up measured
    if cluster.ranks[0].planned is not None:
        cluster = replace(cluster, ranks=count_measured(spec, cluster.ranks, status, kv_room))
        shown = cluster.to_json()
        log.info(
            "layer plan, its runtime as the warm-up measured it where that was more:\n%s",
            format_summary({**shown["plan"], "hops_ms": None, "ranks": shown["ranks"]}),
        )
    return Rank0(
        engine, tokenizer, model_config, grammars, logits.shape[-1], logits.dtype, cluster, kv_room
    )
