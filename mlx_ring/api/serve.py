"""Rank 0's engine process at startup, around the engine that runs on its main thread until it
stops: what the HTTP process serves (HELLO), the HTTP process itself (api/process.py, started by
exec with a clean environment: never a fork of a process that holds MLX), the bridge between
them (serving/bridge.py), and the signals (drain on SIGTERM/SIGINT, fail now on the launcher's
SIGUSR1)."""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING

from mlx_ring.api.served import served_name
from mlx_ring.config import Config
from mlx_ring.models.shape import read_shape
from mlx_ring.models.source import DEFAULT_MODEL
from mlx_ring.planning.growth import GROUP_SPARE_TOKENS
from mlx_ring.planning.sizes import parameter_count
from mlx_ring.rundir import RunDir
from mlx_ring.serving import wire
from mlx_ring.serving.bridge import Bridge
from mlx_ring.serving.rows import one_request
from mlx_ring.settings import MLX, names

if TYPE_CHECKING:
    from mlx_ring.serving.startup import Rank0

log = logging.getLogger("server")


def served_model(cfg: Config, rank0: "Rank0", model_path) -> dict:
    """The model as the HTTP process serves it, from rank 0's assembly: plain values, and what
    loads the tokenizer there (its folder, end tokens, the model module's defaults)."""
    from mlx_lm.utils import _tokenizer_defaults

    kv_room, tokenizer, model_config = rank0.kv_room, rank0.tokenizer, rank0.config
    shape = read_shape(model_config)  # builds the model's classes: MLX, so here
    served = {
        "id": served_name(cfg.served_model_name, cfg.model, DEFAULT_MODEL),
        "context_length": shape.context_length,
        "default_max_tokens": cfg.default_max_tokens,
        "vocab_size": min(rank0.vocab, len(tokenizer.get_vocab())),
        "max_tokens_limit": cfg.max_tokens_limit,
        "request_kv_room": one_request(kv_room, GROUP_SPARE_TOKENS, cfg.draft_tokens)
        if kv_room is not None
        else 0,
        "aliases": list(cfg.model_aliases),
        "config": model_config,
        "parameters": parameter_count(model_config),
        "weights": weights_held(model_config, rank0.dtype),
        "shape": asdict(shape),
    }
    return {
        "served": served,
        "cluster": asdict(rank0.cluster),
        "n_vocab": rank0.vocab,
        "tokenizer": {
            "path": str(model_path),
            "eos_token_ids": sorted(tokenizer.eos_token_ids),
            "defaults": _tokenizer_defaults(model_path),
        },
    }


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


def http_env() -> dict:
    """The HTTP process's environment: this one without MLX's variables (the ring's
    description, rank, devices), which are no business of a process that never runs MLX."""
    drop = set(names(MLX))
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MLX_")}


def start_http(cfg: Config, hello: dict, engine) -> tuple[Bridge, subprocess.Popen]:
    """The HTTP process, exec'd with its end of a socket pair, and the bridge to it."""
    ours, theirs = socket.socketpair()
    granted = wire.widen(ours)
    log.debug("the engine's socket to its HTTP process buffers %s bytes (send, receive)", granted)
    proc = subprocess.Popen(
        [sys.executable, "-m", wire.HTTP_MODULE, "--fd", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        env=http_env(),
    )
    theirs.close()

    def describe() -> str:
        try:
            code = proc.wait(2)  # its socket closes as it exits: its code follows at once
        except subprocess.TimeoutExpired:
            code = None
        return f"the HTTP process (pid {proc.pid}{'' if code is None else f', exit {code}'})"

    bridge = Bridge(engine, ours, describe)
    bridge.start(
        hello
        | {
            "rank": 0,
            "log_dir": str(cfg.log_dir),
            "log_level": cfg.log_level,
            "host": cfg.host,
            "port": cfg.port,
            "tls": tls_files(cfg),
            "max_queue": engine.requests.maxsize,
            "app": {
                "api_key": cfg.api_key,
                "api_keys_file": str(cfg.api_keys_file) if cfg.api_keys_file else None,
                "restarts": cfg.restarts,
                "max_body_bytes": cfg.max_body_bytes,
                "away": cfg.away,
            },
        }
    )
    return bridge, proc


def serve(cfg: Config, engine, hello: dict, ranks: int, plan: str) -> None:
    """Serve the API from the HTTP process while `engine` runs on this thread (the one that owns
    MLX) until it stops; `hello`: `served_model`'s, `ranks`: the ring's size, `plan`: the layer
    plan as the log shows it."""
    tls = tls_files(cfg)  # checked before the HTTP process starts

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
    bridge, proc = start_http(cfg, hello, engine)
    bridge.ready.wait()
    if bridge.refused is not None:
        bridge.closing = True
        engine.stop()
        engine.run()  # tells the other ranks to exit
        proc.wait(10)
        # a refusal, not a crash: a port another program holds stays held, so no restart
        raise ValueError(bridge.refused)
    log.info("layer plan:\n%s", plan)
    log.info(
        "ready: %s://%s:%d/v1 serving %s on %d rank(s) (HTTP process pid %d)",
        "https" if tls else "http",
        cfg.host,
        cfg.port,
        hello["served"]["id"],
        ranks,
        proc.pid,
    )
    engine.run()
    bridge.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        log.warning("the HTTP process (pid %d) outlived the engine; killing it", proc.pid)
        proc.kill()
