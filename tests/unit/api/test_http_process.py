"""Rank 0's HTTP process as the engine process starts it (api/serve.py's start_http), around a
stand-in engine: exec'd as `python -m mlx_ring.api.process` without MLX's variables, it serves,
and it exits (its port freed, the cause in its log) when the engine process dies without a word,
as no parent-death signal would tell it on macOS; after the engine's BYE it exits cleanly."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from mlx_ring.rundir import RunDir

# The engine process, in a process of its own so that it can die by SIGKILL: a stand-in engine
# behind the real bridge, the HTTP process started as server.py starts it.
ENGINE = """
import queue, sys, time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace as NS
from mlx_lm.utils import load_config, load_tokenizer
from mlx_ring.api.serve import served_model, start_http
from mlx_ring.planning.cluster import Cluster, PlanFacts, RankFacts
from mlx_ring.serving.port import Stats

model, logs, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

class Engine:
    requests = queue.Queue(4)
    def stats(self):
        return Stats(0, 0, None, False, None, 0, 0, 0, (0,) * 13, 0.0)
    def submit(self, *reqs): pass
    def cancel(self, *reqs): pass
    def ping(self):
        fut = Future()
        fut.set_result([])
        return fut

cfg = NS(served_model_name=None, model=None, default_max_tokens=16, max_tokens_limit=None,
    draft_tokens=0, model_aliases=(), log_dir=logs, log_level="INFO", host="127.0.0.1",
    port=port, tls=None, api_key=None, api_keys_file=None, restarts=0, max_body_bytes=1 << 20,
    away=None)
config = load_config(model)
cluster = Cluster(
    (RankFacts(rank=0, host="h", layers=(0, 30)),), PlanFacts("balanced", 30, ((0, 30),))
)
rank0 = NS(kv_room=None, tokenizer=load_tokenizer(model), config=config,
    vocab=config["vocab_size"], cluster=cluster, dtype="float32")
bridge, proc = start_http(cfg, served_model(cfg, rank0, model), Engine())
bridge.ready.wait(120)
print(proc.pid, bridge.refused, flush=True)
if sys.argv[4] == "bye":
    bridge.closing = True
    bridge.close()
    print(proc.wait(30), flush=True)
else:
    time.sleep(600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(default_model, tmp_path: Path, end: str):
    port = free_port()
    env = os.environ | {"MLX_RANK": "0", "MLX_HOSTFILE": str(tmp_path / "hosts.json")}
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(default_model), str(tmp_path), str(port), end],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    pid, refused = engine.stdout.readline().split()
    assert refused == "None", refused
    return engine, int(pid), port


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_the_http_process_serves_clean_and_exits_when_the_engine_process_dies(
    default_model, tmp_path
):
    engine, pid, port = start(default_model, tmp_path, "kill")
    try:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        assert models.status_code == 200 and models.json()["data"], models.text
        if sys.platform == "linux":
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert cmd[1:4] == [b"-m", b"mlx_ring.api.process", b"--fd"], cmd
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not [e for e in env if e.startswith(b"MLX_")], env
        engine.send_signal(signal.SIGKILL)  # no BYE, no drain: its sockets close with it
        engine.wait(10)
        deadline = time.monotonic() + 20
        while listens(port):
            assert time.monotonic() < deadline, "the HTTP process outlived its engine process"
            time.sleep(0.1)
    finally:
        if engine.poll() is None:
            engine.kill()
        try:
            os.kill(pid, signal.SIGKILL)  # an orphan, were the test to fail
        except ProcessLookupError:
            pass
    log = RunDir(tmp_path).rank_log(0).read_text()
    assert "rank 0's engine process ended without shutting down" in log, log


def test_after_the_engines_bye_the_http_process_exits_cleanly(default_model, tmp_path):
    engine, _, port = start(default_model, tmp_path, "bye")
    out, _ = engine.communicate(timeout=60)
    assert out.strip() == "0" and not listens(port)
