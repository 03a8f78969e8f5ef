"""Entry point on every rank: `mlx.launch --backend ring --hostfile hosts.json server.py`.

Each rank loads its slice of layers. Rank 0 also holds the embedding and head, runs the engine on
its main thread (the one thread that owns MLX) and serves the OpenAI API from a uvicorn thread.
The other ranks loop on the step protocol until told to shut down.
"""

import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from mlx_ring import gpu

gpu.one_gpu_per_rank()  # before MLX starts

import mlx.core as mx  # noqa: E402
from mlx_lm.utils import load_config, load_model, load_tokenizer

from mlx_ring.config import Config, parse_config
from mlx_ring.hosts.identity import disagreement, identity
from mlx_ring.hosts.weights import find_slice, manifest, pieces_for
from mlx_ring.models.source import DEFAULT_MODEL, resolve_model
from mlx_ring.models.support import UNBATCHED
from mlx_ring.planning.activations import step_tokens
from mlx_ring.planning.assemble import serving
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.growth import GROUP_SPARE_TOKENS
from mlx_ring.planning.plan import LayerPlan
from mlx_ring.planning.planner import plan_ring
from mlx_ring.planning.report import format_summary
from mlx_ring.planning.sizes import parameter_count, spec_from_folder
from mlx_ring.platform import keep_awake
from mlx_ring.ring.leftovers import drop_hostfile, note
from mlx_ring.ring.transport import Ring, exchange, init_world
from mlx_ring.rundir import RunDir
from mlx_ring.serving.prefix import PrefixIndex
from mlx_ring.serving.rows import one_request
from shard import Shard, load_shard, serve_worker

log = logging.getLogger("server")


def setup_logging(cfg: Config, rank: int) -> None:
    """Every line carries rank and host; rank r also writes `logs/rank{r}.log` on its own machine."""
    host = socket.gethostname()

    class Tag(logging.Filter):
        def filter(self, record):
            record.rank, record.host = rank, host
            return True

    fmt = logging.Formatter("%(asctime)s [rank %(rank)d %(host)s] %(levelname)s %(name)s: %(message)s")
    cfg.log_dir.mkdir(parents=True, exist_ok=True)
    handlers = [logging.StreamHandler(sys.stderr), logging.FileHandler(RunDir(cfg.log_dir).rank_log(rank))]
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(Tag())
    logging.basicConfig(level=cfg.log_level, handlers=handlers, force=True)


def make_plan(cfg: Config, spec, world: mx.distributed.Group) -> tuple[LayerPlan, list[Capabilities], dict]:
    """Every rank measures itself (cached per host), the ranks exchange what they found, and each
    computes the same plan from the model's sizes (weight headers only); LAYERS= fixes the counts.
    Returns the plan, every rank's capabilities as planned with, and the plan's summary."""
    return plan_ring(cfg, spec, world)


def gather_cluster(shard: Shard, world: mx.distributed.Group, predicted: dict | None = None) -> dict:
    """Every rank's static facts (host, range, bytes held), gathered with one collective, plus the
    planner's view of each rank (capabilities, memory needed, predicted stage time)."""
    ranks = []
    for info in exchange(shard.info(), world):
        kib = info.pop("parameter_bytes") >> 10
        ranks.append(info | {"parameter_bytes_kib": kib})
    plan = shard.plan
    out = {"ranks": ranks, "plan": {"strategy": plan.strategy, "n_layers": plan.n_layers, "ranges": [list(x) for x in plan.ranges]}}
    if predicted:  # every rank computed the same prediction; merge it in without overwriting measured facts
        for r, p in zip(ranks, predicted["ranks"]):
            r.update({k: v for k, v in p.items() if k not in r})
        out["plan"].update({k: predicted[k] for k in ("kv_tokens", "kv_capacity_tokens", "predicted_tokens_per_s", "slowest_stage_ms")})
    return out


def prefill_chunk(cfg: Config, cluster: dict, layer_flops: float) -> int:
    """PREFILL_CHUNK, else by device: the engine takes in requests and cancellations only between
    steps, and 512 prompt tokens take seconds on a CPU (milliseconds on a big GPU). Fewer where a
    Mac's stage of a chunk would near Metal's watchdog (`gpu.watchdog_chunk`), from each Mac's
    measured speed (`cluster`: ranks with a recommended working set) and a layer's FLOPs per token."""
    if cfg.prefill_chunk:
        return cfg.prefill_chunk
    cap = 128 if mx.default_device() == mx.cpu else 512
    macs = [(r["host"], (r["layers"][1] - r["layers"][0]) * layer_flops, r["tflops"])
            for r in cluster["ranks"] if r.get("working_set_gb")]
    if not macs:
        return cap
    chunk = gpu.watchdog_chunk(macs, cap)
    log.info("prefill chunks of %d tokens: the busiest Mac's stage of one stays within %.0f s (Metal's watchdog "
             "aborts at about %.0f s); PREFILL_CHUNK sets it", chunk, gpu.STAGE_BUDGET_S, gpu.WATCHDOG_S)
    return chunk


def prompt_cache(cfg: Config, shard: Shard, spec, cluster: dict) -> PrefixIndex | None:
    """Rank 0's prompt-cache index. Every rank holds an entry's tokens for its own layers, in the
    memory the plan set aside for it (PROMPT_CACHE_GB, or less on a small host): the budget in
    tokens is what the tightest rank holds. None when off or when the caches are not plain KV caches."""
    if not cfg.prompt_cache_gb or not shard.plain_kv:
        if cfg.prompt_cache_gb:
            log.info("prompt cache off: this model's caches cannot be reused by prefix")
        return None
    per_token = spec.kv_bytes_per_token  # one layer's
    kept = [r.get("prompt_cache_gb", cfg.prompt_cache_gb) for r in cluster["ranks"]]
    budget = min(int(gb * 2**30 / (per_token * (e - s))) for gb, (s, e) in zip(kept, shard.plan.ranges))
    log.info("prompt cache: %s GB on the ranks, %d tokens", "/".join(f"{gb:g}" for gb in kept), budget)
    return PrefixIndex(budget)


def draft_model(cfg: Config, vocab: int):
    """DRAFT_MODEL, loaded whole on rank 0, or None; it must give logits over the same vocabulary."""
    if not cfg.draft_model:
        return None
    path = resolve_model(cfg.draft_model, cfg.cache_dir, cfg.weights)
    model, _ = load_model(path)
    rows = model(mx.array([[0]])).shape[-1]  # only the shape is read: nothing computed
    if rows != vocab:
        raise ValueError(f"DRAFT_MODEL {cfg.draft_model} gives logits over {rows} tokens, the model over {vocab}; "
                         "a draft model must share the model's tokenizer (pick one of the same family)")
    log.info("drafts from %s, up to %d tokens a step", path.name, cfg.draft_tokens)
    return model


def serve_rank0(cfg: Config, shard: Shard, ring: Ring, model_path, spec, cluster: dict, caps: list[Capabilities]) -> None:
    import uvicorn

    from mlx_ring.api.app import make_app, warm_http
    from mlx_ring.api.keys import load_keys
    from mlx_ring.api.served import Cluster, ServedModel, served_name
    from mlx_ring.ring.pipeline import Pipeline
    from mlx_ring.serving.engine import Engine
    from mlx_ring.serving.grammar import Grammars
    from mlx_ring.serving.scheduler import Scheduler
    from mlx_ring.serving.warmup import count_measured, decode_groups, fit_room, warm

    room = cluster["plan"].get("kv_capacity_tokens")  # token-rows of KV cache every rank has room for
    if room is not None:
        log.info("KV cache: room for %d tokens at once on every rank (the plan keeps %d: KV_TOKENS); requests wait "
                 "for room", room, cluster["plan"]["kv_tokens"])
    model_config = load_config(model_path)
    tokenizer = load_tokenizer(model_path, eos_token_ids=model_config.get("eos_token_id"))
    logits = shard.head(shard.embed(mx.array([[0]])))  # (1, 1, V): only its shape is read, nothing computed
    grammars = Grammars(tokenizer, logits.shape[-1])
    groups, why = decode_groups(cfg.groups, caps, shard.batches)
    log.info("decode groups: %d (%s)", groups, why if cfg.groups else f"{why}; GROUPS sets the number")
    if not shard.batches:
        log.info("batching off (%s): each of the %d decode groups (GROUPS) serves one request at a time",
                 UNBATCHED[model_config["model_type"]], groups)
    if cfg.draft_tokens and not shard.plain_kv:
        log.info("speculative decoding off: this model's caches cannot drop rejected drafts")
    chunk = prefill_chunk(cfg, cluster, spec.layer_flops)
    sched = Scheduler(Pipeline(shard, ring), shard, groups=groups, chunk=chunk,
                      prefix=prompt_cache(cfg, shard, spec, cluster),
                      draft_tokens=cfg.draft_tokens if shard.plain_kv else 0,
                      draft_model=draft_model(cfg, logits.shape[-1]) if shard.plain_kv else None,
                      kv_budget=max(1, room) if room is not None else 0, kv_spare=GROUP_SPARE_TOKENS,
                      prefill_budget=step_tokens(serving(spec, cfg.prefill_chunk, cfg.max_active)))
    engine = Engine(sched, tokenizer, max_queue=cfg.max_queue, max_active=cfg.max_active,
                    step_timeout=cfg.step_timeout, drain_timeout=cfg.drain_timeout, constrain=grammars.processor)
    engine.peers = ", ".join(f"{r['rank']} on {r['host']}" for r in cluster["ranks"][1:])
    hello = (tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
             if getattr(tokenizer, "chat_template", None) else tokenizer.encode("Hello"))
    status = warm(sched, engine.seq_ids, hello, cfg.max_active, chunk,
                  may_regroup=not cfg.groups and shard.batches)
    if room is not None:  # what the warm-up's activations took beyond the plan's runtime comes out of the room
        room = cluster["plan"]["kv_capacity_tokens"] = fit_room(spec, cluster["ranks"], status, room,
                                                                cluster["plan"]["kv_tokens"])
        sched.kv_budget = max(1, room)
    if "needs_gb" in cluster["ranks"][0]:  # the plan's figures, now counting what the warm-up measured
        count_measured(spec, cluster["ranks"], status, room if room is not None else 0)
        log.info("layer plan, its runtime as the warm-up measured it where that was more:\n%s",
                 format_summary({**cluster["plan"], "hops_ms": None, "ranks": cluster["ranks"]}))
    served = ServedModel(
        id=served_name(cfg.served_model_name, cfg.model, DEFAULT_MODEL),
        tokenizer=tokenizer,
        context_length=model_config.get("max_position_embeddings") or 4096,
        default_max_tokens=cfg.default_max_tokens,
        vocab_size=min(logits.shape[-1], len(tokenizer.get_vocab())),
        max_tokens_limit=cfg.max_tokens_limit,
        cache_tokens=one_request(room, GROUP_SPARE_TOKENS, cfg.draft_tokens) if room is not None else 0,
        cluster=Cluster(**cluster),
        grammars=grammars,
        aliases=cfg.model_aliases,
        config=model_config,
        parameters=parameter_count(model_config),
        weights=weights_held(model_config, logits.dtype),
    )
    app = make_app(engine, served, load_keys(cfg.api_key, cfg.api_keys_file), cfg.restarts, cfg.max_body_bytes, cfg.away)
    warm_http(make_app(engine, served, (), cfg.restarts, cfg.max_body_bytes, cfg.away))
    for f in cfg.tls or ():
        if not f.is_file():  # checked here: only rank 0's host needs the files
            raise ValueError(f"{f} (TLS_CERT / TLS_KEY) is not a file on {socket.gethostname()}; give PEM files there")
    tls = {"ssl_certfile": str(cfg.tls[0]), "ssl_keyfile": str(cfg.tls[1])} if cfg.tls else {}
    http = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None, timeout_graceful_shutdown=5, **tls))
    web = threading.Thread(target=http.run, name="http", daemon=True)

    def on_signal(signum, _frame):
        log.info("signal %d: draining (up to %.0f s), then shutting down every rank", signum, cfg.drain_timeout)
        engine.stop()  # HTTP stays up meanwhile, answering 503 to new requests

    def on_peer_lost(_signum, _frame):
        # The launcher saw a rank's host go (its ssh session ended): fail the requests now, naming it,
        # rather than after STEP_TIMEOUT. Off this thread: the engine may hold its lock right now.
        try:
            why = RunDir(cfg.log_dir).broken.read_text().strip()
        except OSError:
            why = "a rank left the ring"
        threading.Thread(target=engine.fail, args=(why,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, on_peer_lost)
    web.start()
    while not http.started and web.is_alive():
        web.join(0.05)
    if not web.is_alive():
        engine.stop()
        engine.run()  # tells the other ranks to exit
        raise SystemExit(f"the HTTP server could not start on {cfg.host}:{cfg.port} (port in use?); set PORT")
    hosts = [r["host"] for r in cluster["ranks"]]
    log.info("layer plan:\n%s", shard.plan.describe(hosts))
    log.info("ready: %s://%s:%d/v1 serving %s on %d rank(s)", "https" if cfg.tls else "http", cfg.host, cfg.port, served.id, ring.size)
    engine.run()
    http.should_exit = True
    web.join(5)


def weights_held(config: dict, dtype: mx.Dtype) -> str:
    """How the model's weights are held, as Ollama names it: MLX's quantization ("int4", or its mode,
    e.g. "mxfp4"), else the float type the head computes in ("float32", "bfloat16")."""
    q = config.get("quantization") or {}
    if q.get("bits"):
        return f"int{q['bits']}" if q.get("mode", "affine") == "affine" else q["mode"]
    return str(dtype).rsplit(".", 1)[-1]


def local_model(cfg: Config, rank: int) -> Path:
    """The slice the launcher sent this host for this rank under this plan (RING_MODEL_ID, RING_PLAN),
    whatever other slices the cache holds; else the model resolved here (rank 0's own machine)."""
    if cfg.model_id and cfg.plan and rank < len(cfg.plan[1]):
        start = sum(cfg.plan[1][:rank])
        found = find_slice(cfg.cache_dir, cfg.model_id, pieces_for(range(start, start + cfg.plan[1][rank]), rank == 0))
        if found:
            return found
    return resolve_model(cfg.model, cfg.cache_dir, cfg.weights)


def check_agreement(cfg: Config, model_path: Path, world: mx.distributed.Group) -> None:
    """Every rank serves the same model with the same code and versions, or none starts."""
    model_id = manifest(model_path, cfg.cache_dir)["id"]
    if cfg.model_id and model_id != cfg.model_id:
        raise ValueError(f"this host's model {model_path} (id {model_id}) is not the one the launcher sent "
                         f"(id {cfg.model_id}); start the ring with ./launch.sh")
    problem = disagreement(exchange(identity(model_id), world))
    if problem:
        raise ValueError(problem)


def main() -> None:
    keep_awake(os.getpid())  # a Mac on default settings would idle to sleep under the ring
    cfg, prepare_only = parse_config()
    note(RunDir(cfg.log_dir).tempfiles)  # mlx.launch's temporary files, removed once this rank is gone
    world = init_world(cfg.ring_socket_buffer, cfg.ring_verbose)
    drop_hostfile()
    rank = world.rank()
    setup_logging(cfg, rank)
    model_path = local_model(cfg, rank)
    if prepare_only:
        print(model_path)
        return
    gpu.wire_memory()  # as mlx-lm does before it generates: before the weights load
    check_agreement(cfg, model_path, world)
    spec = spec_from_folder(model_path)  # the model's sizes, read once: for the plan and the prompt cache
    plan, caps, predicted = make_plan(cfg, spec, world)
    if rank == 0:
        log.info("layer plan %s:\n%s", plan.strategy, format_summary(predicted))
    shard = load_shard(model_path, plan, rank)
    log.info("loaded layers [%d, %d) from %s: %.1f MiB", shard.start, shard.end, model_path, shard.info()["parameter_bytes"] / 2**20)
    cluster = gather_cluster(shard, world, predicted)
    # launch.sh's supervisor watches rank 0's pid: if rank 0 dies while another rank hangs, it forces a restart.
    RunDir(cfg.log_dir).rank_pid(rank).write_text(str(os.getpid()))
    ring = Ring(world, cfg.receive_apart)
    if ring.apart:
        log.info("receiving %s payloads before building the stage on them (RECEIVE_APART%s)",
                 " and ".join(sorted(k.name.lower() for k in ring.apart)), "=auto, on Metal" if cfg.receive_apart is None else "")
    if rank == 0:
        serve_rank0(cfg, shard, ring, model_path, spec, cluster, caps)
    else:  # until rank 0's shutdown step passes by, the ring breaks, or a SIGTERM and a silent predecessor
        serve_worker(shard, ring, cfg.drain_timeout)
    log.info("exiting")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # configuration errors: one clear line, no traceback; launch.sh does not retry
        logging.getLogger("server").error("cannot start: %s", e)
        sys.exit(2)
