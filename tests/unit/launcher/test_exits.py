"""How a rank ends and what the supervisor makes of it (mlx_ring/exits.py, launcher/supervisor.py):
a refusal line written by a rank is found in the ring's output whatever prefixes it, a rank that
cannot start stops the ring with its reason, and every other way a rank ends restarts it."""

import logging
import signal
import socket
import subprocess
import sys

import pytest

from mlx_ring import exits
from mlx_ring.config import ROOT
from mlx_ring.launcher import supervisor
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.waiting import read_state

HOSTS = ["127.0.0.1", "mini-b"]


def test_a_refusal_is_found_whatever_prefixes_its_line_and_only_a_refusal():
    out = "\n".join(
        [
            "2025-01-01 10:00:00 [rank 1 mini-b] ERROR server: "
            + exits.refusal("rank 1 on mini-b has model x"),
            exits.refusal("cannot reach mini-c over ssh"),  # as up.py prints it
            "2025-01-01 10:00:01 [rank 0 mini-a] INFO engine: cannot start generation: bad sampler",
            "Node with rank 1 exited with code 2",
        ]
    )
    assert exits.refusals(out) == [
        "cannot start: rank 1 on mini-b has model x",
        "cannot start: cannot reach mini-c over ssh",
    ]
    assert exits.refusals("Node with rank 1 exited with code 75\n") == []


@pytest.mark.parametrize("code", [exits.CRASHED, exits.RING_BROKEN, exits.SSH_ENDED, None, -9])
def test_every_code_but_refused_restarts_the_ring(code):
    assert supervisor.must_stop({1: code}, "Node with rank 1 exited with code ...\n", HOSTS) is None
    assert supervisor.must_stop({0: exits.RING_BROKEN, 1: code}, "", HOSTS) is None


def test_a_ring_whose_ranks_all_shut_down_unasked_restarts():
    assert supervisor.ON_EXIT[exits.SHUT_DOWN] == supervisor.RESTART
    assert supervisor.must_stop({}, "", HOSTS) is None  # mlx.launch names no rank that exited 0


def test_a_rank_that_cannot_start_stops_the_ring_with_its_own_reason():
    out = (
        "2025-01-01 [rank 1 mini-b] ERROR server: " + exits.refusal("set MODEL once") + "\n"
        "Node with rank 1 exited with code 2\nNode with rank 0 exited with code 75\n"
    )
    assert (
        supervisor.must_stop({1: exits.REFUSED, 0: exits.RING_BROKEN}, out, HOSTS)
        == "cannot start: set MODEL once"
    )
    # A refusal line stops the ring whatever code its rank's end was reported with.
    assert supervisor.must_stop({1: None}, out, HOSTS) == "cannot start: set MODEL once"


def test_refused_without_a_line_saying_why_still_stops_naming_the_rank():
    why = supervisor.must_stop(
        {0: exits.RING_BROKEN, 1: exits.REFUSED}, "usage: server.py ...\n", HOSTS
    )
    assert why == "cannot start: rank 1 on mini-b: code 2 (see its output in launcher.log)"
    assert exits.refusals(why) == [why]  # `start` finds it in launcher.log as it finds a rank's own


def rank(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "server.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "MLX_RANK": "1", **env},
    )


def test_a_rank_refused_a_setting_exits_refused_with_the_line_the_supervisor_stops_on():
    p = rank("--port", "0")
    assert p.returncode == exits.REFUSED, p.stderr
    assert supervisor.must_stop({1: p.returncode}, p.stderr, HOSTS) == (
        "cannot start: PORT=0 is not a TCP port; pick one in 1-65535"
    )


def test_a_rank_refused_its_arguments_by_argparse_stops_the_ring_too():
    p = rank("--no-such-flag")
    assert p.returncode == exits.REFUSED and "unrecognized arguments" in p.stderr, p.stderr
    assert supervisor.must_stop({1: p.returncode}, p.stderr, HOSTS).startswith(
        "cannot start: rank 1 on mini-b: code 2"
    )


@pytest.fixture
def supervised(tmp_path, monkeypatch):
    """`supervise` over attempts that end as the test says, with no ring, host or sweep."""
    s = LaunchSettings("hosts.json", "127.0.0.1", 0, 32323, 60, 5, 1, tmp_path / "logs", False)
    s.planned.mkdir(parents=True)
    ends, calls = [], {"runs": 0, "hosts": 0}

    def run_ring(settings, args, restarts, stopping, away=None):
        calls["runs"] += 1
        return ends.pop(0)

    def restart_hosts(settings, args, stopping, away):
        calls["hosts"] += 1
        return True

    monkeypatch.setattr(supervisor, "run_ring", run_ring)
    monkeypatch.setattr(supervisor, "restart_hosts", restart_hosts)
    monkeypatch.setattr(supervisor, "sweep_hosts", lambda *a, **k: None)
    monkeypatch.setattr(supervisor, "rank_hosts", lambda settings: HOSTS)
    # supervise sets its own
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield s, ends, calls
    signal.signal(signal.SIGTERM, handlers[0])
    signal.signal(signal.SIGINT, handlers[1])


def test_the_supervisor_stops_a_refused_ring_at_once_with_the_reason(supervised):
    s, ends, calls = supervised
    ends.append(({1: exits.REFUSED}, exits.refusal("rank 1 on mini-b has model x") + "\n"))
    assert supervisor.supervise(s, []) == 3
    assert calls == {"runs": 1, "hosts": 0}
    state = read_state(s.state_file)
    assert (
        state["state"] == "failed" and state["why"] == "cannot start: rank 1 on mini-b has model x"
    ), state


def test_the_supervisor_restarts_a_broken_ring_until_max_restarts(supervised, caplog):
    s, ends, calls = supervised
    ends += [({1: exits.RING_BROKEN}, ""), ({1: exits.SSH_ENDED}, "")]
    with caplog.at_level(logging.INFO, logger="launcher"):
        # MAX_RESTARTS=1: the second failure in a row gives up
        assert supervisor.supervise(s, []) == 1
    assert calls == {"runs": 2, "hosts": 1}
    assert "the ring exited (rank 1 on mini-b: code 75); restart 1 of 1 in 2 s" in caplog.text, (
        caplog.text
    )
    state = read_state(s.state_file)
    assert (
        state["state"] == "failed"
        and "failed 2 times in a row (rank 1 on mini-b: code 255)" in state["why"]
    ), state


def test_a_rank_0_whose_port_is_held_refuses_to_start_rather_than_restarting():
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        p = subprocess.run(
            [sys.executable, "server.py", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        held.close()
    assert p.returncode == exits.REFUSED, p.stderr[-2000:]
    assert supervisor.must_stop({0: p.returncode}, p.stderr, HOSTS) == (
        f"cannot start: the HTTP server could not start on 127.0.0.1:{port} "
        "(port in use?); set PORT"
    )


METAL_TIMEOUT = (
    "[METAL] Command buffer execution failed: Caused GPU Timeout Error "
    "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)."
)


def test_a_rank_whose_gpu_failed_restarts_the_ring_as_a_crash_does():
    assert supervisor.ON_EXIT[exits.DEVICE_FAILED] == supervisor.ON_EXIT[exits.CRASHED]
    out = exits.gpu_failure(1, METAL_TIMEOUT) + "\nNode with rank 1 exited with code 71\n"
    assert supervisor.must_stop({0: exits.RING_BROKEN, 1: exits.DEVICE_FAILED}, out, HOSTS) is None


def test_the_supervisor_names_the_rank_whose_gpu_failed_and_restarts_it_within_max_restarts(
    supervised, caplog
):
    s, ends, calls = supervised
    out = (
        "2026-01-01 10:00:00 [rank 1 mini-b] ERROR mlx_ring.gpu: "
        + exits.gpu_failure(1, METAL_TIMEOUT)
        + "\nNode with rank 1 exited with code 71\nNode with rank 0 exited with code 75\n"
    )
    ends += [({0: exits.RING_BROKEN, 1: exits.DEVICE_FAILED}, out)] * 2
    with caplog.at_level(logging.INFO, logger="launcher"):
        assert supervisor.supervise(s, []) == 1  # MAX_RESTARTS=1: the second in a row gives up
    assert calls == {"runs": 2, "hosts": 1}
    named = (
        "rank 0: code 75, rank 1 on mini-b: code 71 (its GPU failed); rank 1 on mini-b: the GPU "
        "failed a command buffer (kIOGPUCommandBufferCallbackErrorTimeout): a GPU command buffer "
        "ran, or waited, longer than the GPU watchdog allows"
    )
    assert f"the ring exited ({named}" in caplog.text and "restart 1 of 1" in caplog.text, (
        caplog.text
    )
    state = read_state(s.state_file)
    assert state["state"] == "failed" and named in state["why"], state


def test_a_rank_process_whose_gpu_fails_exits_device_failed_with_the_line_the_launcher_names():
    # server.py's own handler, as a worker's step or any rank's start-up meets the error: here the
    # ring's start raises it (MLX raises it from the eval that meets it, in any of these)
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, mlx_ring.ring.world as w\n"
            "def failed(*a, **k):\n"
            f"    raise RuntimeError({METAL_TIMEOUT!r})\n"
            "w.init_world = failed\n"
            "runpy.run_path('server.py', run_name='__main__')\n",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "MLX_RANK": "1"},
    )
    assert p.returncode == exits.DEVICE_FAILED, p.stderr
    assert exits.gpu_failures(p.stderr) == {1: METAL_TIMEOUT} and "Traceback" not in p.stderr
    assert supervisor.must_stop({1: p.returncode}, p.stderr, HOSTS) is None


def test_a_rank_0_whose_http_process_died_has_a_code_of_its_own_named_and_restarts():
    codes = [v for k, v in vars(exits).items() if k.isupper() and isinstance(v, int)]
    assert len(codes) == len(set(codes)), "two ways a rank ends share an exit code"
    assert supervisor.must_stop({0: exits.HTTP_LOST}, "", HOSTS) is None
    said = supervisor.exit_codes({0: exits.HTTP_LOST}, HOSTS)
    assert said == f"rank 0: code {exits.HTTP_LOST} (its HTTP process died)"
