"""Rank 0's HTTP side at startup: the model as the API serves it, the TLS files, the uvicorn thread
and the signals (drain on SIGTERM/SIGINT, fail now on the launcher's SIGUSR1), around the engine
that runs on the main thread until it stops."""

import logging
import signal
import socket
import threading
from typing import TYPE_CHECKING

from mlx_ring.api.app import make_app, warm_http
from mlx_ring.api.keys import load_keys
from mlx_ring.api.served import ServedModel, served_name
from mlx_ring.config import Config
from mlx_ring.models.shape import read_shape
from mlx_ring.models.source import DEFAULT_MODEL
from mlx_ring.planning.growth import GROUP_SPARE_TOKENS
from mlx_ring.planning.sizes import parameter_count
from mlx_ring.rundir import RunDir
from mlx_ring.serving.rows import one_request

if TYPE_CHECKING:
    from mlx_ring.serving.startup import Rank0

log = logging.getLogger("server")


def served_model(cfg: Config, rank0: "Rank0") -> ServedModel:
    """The model as the HTTP side sees it, from rank 0's assembly."""
    kv_room, tokenizer, model_config = rank0.kv_room, rank0.tokenizer, rank0.config
    shape = read_shape(model_config)
    return ServedModel(
        id=served_name(cfg.served_model_name, cfg.model, DEFAULT_MODEL),
        tokenizer=tokenizer,
        context_length=shape.context_length,
        default_max_tokens=cfg.default_max_tokens,
        vocab_size=min(rank0.vocab, len(tokenizer.get_vocab())),
        max_tokens_limit=cfg.max_tokens_limit,
        request_kv_room=one_request(kv_room, GROUP_SPARE_TOKENS, cfg.draft_tokens)
        if kv_room is not None
        else 0,
        cluster=rank0.cluster,
        grammars=rank0.grammars,
        aliases=cfg.model_aliases,
        config=model_config,
        shape=shape,
        parameters=parameter_count(model_config),
        weights=weights_held(model_config, rank0.dtype),
    )


def weights_held(config: dict, dtype) -> str:
    """How the model's weights are held, as Ollama names it: MLX's quantization ("int4", or its
    mode, e.g. "mxfp4"), else the float type the head computes in ("float32", "bfloat16")."""
    q = config.get("quantization") or {}
    if q.get("bits"):
        return f"int{q['bits']}" if q.get("mode", "affine") == "affine" else q["mode"]
    return str(dtype).rsplit(".", 1)[-1]


def tls_files(cfg: Config) -> dict:
    """uvicorn's TLS arguments from TLS_CERT / TLS_KEY (none: plain HTTP); checked here, since only
    rank 0's host needs the files."""
    for f in cfg.tls or ():
        if not f.is_file():
            raise ValueError(
                (
                    f"{f} (TLS_CERT / TLS_KEY) is not a file on {socket.gethostname()}; "
                    "give PEM files there"
                )
            )
    return {"ssl_certfile": str(cfg.tls[0]), "ssl_keyfile": str(cfg.tls[1])} if cfg.tls else {}


def serve(cfg: Config, engine, served: ServedModel, ranks: int, plan: str) -> None:
    """Serve the API from a uvicorn thread while `engine` runs on this thread (the one that owns
    MLX) until it stops; `ranks`: the ring's size, `plan`: the layer plan as the log shows it."""
    import uvicorn

    app = make_app(
        engine,
        served,
        load_keys(cfg.api_key, cfg.api_keys_file),
        cfg.restarts,
        cfg.max_body_bytes,
        cfg.away,
    )
    warm_http(make_app(engine, served, (), cfg.restarts, cfg.max_body_bytes, cfg.away))
    tls = tls_files(cfg)
    http = uvicorn.Server(
        uvicorn.Config(
            app, host=cfg.host, port=cfg.port, log_config=None, timeout_graceful_shutdown=5, **tls
        )
    )
    web = threading.Thread(target=http.run, name="http", daemon=True)

    def on_signal(signum, _frame):
        log.info(
            "signal %d: draining (up to %.0f s), then shutting down every rank",
            signum,
            cfg.drain_timeout,
        )
        engine.stop()  # HTTP stays up meanwhile, answering 503 to new requests

    def on_peer_lost(_signum, _frame):
        # The launcher saw a rank's host go (its ssh session ended): fail the requests now,
        # naming it, rather than after STEP_TIMEOUT. Off this thread: the engine may hold
        # its lock right now.
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
        # a refusal, not a crash: a port another program holds stays held, so no restart
        raise ValueError(
            f"the HTTP server could not start on {cfg.host}:{cfg.port} (port in use?); set PORT"
        )
    log.info("layer plan:\n%s", plan)
    log.info(
        "ready: %s://%s:%d/v1 serving %s on %d rank(s)",
        "https" if cfg.tls else "http",
        cfg.host,
        cfg.port,
        served.id,
        ranks,
    )
    engine.run()
    http.should_exit = True
    web.join(5)
