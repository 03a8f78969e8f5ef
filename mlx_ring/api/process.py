"""Rank 0's HTTP process: `python -m mlx_ring.api.process --fd N`, started by the engine process
(api/serve.py) with the socket it talks over. It templates, tokenizes, detokenizes and serves
every dialect with uvicorn, never importing MLX, so HTTP work never takes the engine's
interpreter. Its life is the engine's: it ignores SIGINT and SIGTERM (the engine drains on them)
and exits when the engine's socket closes."""

import argparse
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

from mlx_ring.serving import wire

log = logging.getLogger("http")


def setup_logging(hello: dict) -> None:
    """As the ranks log (server.setup_logging): rank and host on every line, to stderr and to
    rank 0's log file."""
    from mlx_ring.rundir import log_as_rank

    log_dir = hello.get("log_dir")
    log_as_rank(hello["rank"], Path(log_dir) if log_dir else None, hello["log_level"])


def served_model(hello: dict):
    """The model as the routes see it, from HELLO: the tokenizer loaded here, without MLX."""
    from mlx_ring.api.served import ServedModel
    from mlx_ring.api.tokenizer import GrammarCheck, load_tokenizer
    from mlx_ring.models.shape import ModelShape

    s, t = hello["served"], hello["tokenizer"]
    tokenizer = load_tokenizer(t["path"], t["eos_token_ids"], t["defaults"])
    return ServedModel(
        **{**s, "shape": ModelShape(**s["shape"])},
        tokenizer=tokenizer,
        cluster=wire.cluster_in(hello["cluster"]),
        grammars=GrammarCheck(tokenizer, hello["n_vocab"]),
    )


def serve(sock: socket.socket, hello: dict) -> int:
    import uvicorn

    from mlx_ring.api.app import make_app, warm_http
    from mlx_ring.api.keys import load_keys
    from mlx_ring.api.remote import RemoteEngine

    app_args = hello["app"]
    served = served_model(hello)
    keys_file = app_args["api_keys_file"]
    keys = load_keys(app_args["api_key"], Path(keys_file) if keys_file else None)
    ended, clean = threading.Event(), []

    def on_end(was_clean: bool) -> None:
        clean.append(was_clean)
        ended.set()

    engine = RemoteEngine(
        sock, served.tokenizer, hello["max_queue"], wire.stats_in(hello["stats"]), on_end
    )
    rest = (app_args["restarts"], app_args["max_body_bytes"], app_args["away"])
    app = make_app(engine, served, keys, *rest)
    warm_http(make_app(engine, served, (), *rest))
    host, port = hello["host"], hello["port"]
    http = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, log_config=None, timeout_graceful_shutdown=5, **hello["tls"]
        )
    )
    engine.start()
    web = threading.Thread(target=http.run, name="http", daemon=True)
    web.start()
    while not http.started and web.is_alive():
        web.join(0.05)
    if not web.is_alive():
        why = f"the HTTP server could not start on {host}:{port} (port in use?); set PORT"
        engine.send(wire.REFUSED, why=why)
        engine.out.close()
        return 2
    engine.send(wire.READY)
    while not ended.wait(0.5):
        if not web.is_alive():
            log.error("the HTTP server stopped by itself; the engine process exits with it")
            return 1
    if not clean[0]:
        log.error("rank 0's engine process ended without shutting down; the HTTP process exits")
    http.should_exit = True
    web.join(6)
    return 0 if clean[0] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the socket to the engine process")
    args = parser.parse_args(argv)
    # the engine drains on these and then closes the socket, which ends this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    wire.widen(sock)
    hello = wire.Reader(sock).read()
    if hello is None or hello["k"] != wire.HELLO:
        print("http: the engine process closed the socket before its HELLO", file=sys.stderr)
        return 1
    try:
        setup_logging(hello)
        return serve(sock, hello)
    except ValueError as e:  # a setting (API_KEYS_FILE, say): the engine process refuses with it
        sock.sendall(wire.pack(wire.REFUSED, why=str(e)))
        return 2
    except Exception as e:
        log.exception("the HTTP process failed")
        try:
            sock.sendall(wire.pack(wire.REFUSED, why=f"the HTTP process failed: {e}"))
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
