"""Start the real server under mlx.launch for a test module, and stop every rank afterwards."""

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
from ringutil import ROOT, free_port, launch_cmd


@contextmanager
def running_server(
    tmp: Path,
    n_ranks: int = 2,
    extra_args: list[str] = (),
    env: dict | None = None,
    timeout: float = 300,
    wrapper: list[str] = (),
):
    """`wrapper`: a script (and its arguments) that runs server.py, in its place."""
    port = free_port()
    argv = [
        *wrapper,
        str(ROOT / "server.py"),
        "--port",
        str(port),
        "--log-dir",
        str(tmp / "logs"),
        *extra_args,
    ]
    log = open(tmp / "launcher.log", "w")
    proc = subprocess.Popen(
        launch_cmd(n_ranks, tmp, argv),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, (
                f"server exited early:\n{(tmp / 'launcher.log').read_text()[-5000:]}"
            )
            assert time.monotonic() < deadline, "server did not become healthy"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
