"""The first command's steps as a stock Mac runs them: bash 3.2 as /bin/sh and a PATH of only what a
fresh macOS has (no setsid, nproc, free, ip, ss, timeout; python3 and git only as Xcode stubs that
must not run). `--help`, `prepare`, `start`, `status`, `logs` and `stop` on two local ranks."""

import os
import subprocess

import httpx
import pytest
from ringutil import ROOT, free_port, write_hostfile
from stockmac import BASH_32, stock_path, stubs_called


@pytest.mark.skipif(
    not BASH_32.exists(), reason=f"no bash 3.2 at {BASH_32} (the project's shared/mac folder)"
)
def test_first_command_on_a_stock_mac_userland(tmp_path, default_model):
    stock = tmp_path / "stock"
    port = free_port()
    env = {
        "PATH": stock_path(stock),
        "HOME": os.environ["HOME"],
        "PORT": str(port),
        "RING_PORT": str(free_port(3)),
        "LOG_DIR": str(tmp_path / "logs"),
        "HOSTFILE": str(write_hostfile(tmp_path / "hosts.json", 2)),
    }

    def launch(*args, timeout=300):
        return subprocess.run(
            [f"{stock}/sh", "launch.sh", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    try:
        p = launch("--help")
        assert p.returncode == 0 and "usage: ./launch.sh" in p.stdout, p.stderr
        p = launch("prepare")
        assert p.returncode == 0 and p.stdout.strip().endswith(default_model.name), (
            p.stdout + p.stderr
        )
        p = launch("start")
        assert p.returncode == 0 and f"ready: http://127.0.0.1:{port}/v1" in p.stderr, (
            p.stdout + p.stderr[-3000:]
        )
        assert "[0, " in p.stdout and "+ ends" in p.stdout  # the plan's table
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=120,
            json={
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 12,
                "temperature": 0,
            },
        )
        assert "Paris" in r.json()["choices"][0]["message"]["content"]
        p = launch("status")
        assert p.returncode == 0 and "rank  host" in p.stdout, p.stdout + p.stderr
        p = launch("logs", "5")
        assert p.returncode == 0 and "rank0.log" in p.stdout, p.stdout + p.stderr
    finally:
        p = launch("stop", timeout=120)
    assert p.returncode == 0 and "stopped" in p.stderr, p.stderr
    assert launch("status").returncode == 1
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in left and f"--starting-port {env['RING_PORT']}" not in left
    assert stubs_called(stock) == []  # neither python3 nor git was run
