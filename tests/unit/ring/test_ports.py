"""A rank's own ring port is never handed to its outgoing connections, and a port another program
holds is refused in a sentence (world._hold_own_ports)."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from ringutil import ROOT

from mlx_ring import platform
from mlx_ring.ring import world as ring_world
from mlx_ring.ring.launch import free_port

# In a network namespace of its own, the last rank of a ring of two as MLX's ring backend starts
# it: it connects to rank 0 first, then listens on its own port. The namespace hands out a single
# ephemeral port, the rank's own, as a busy machine may.
LAST_RANK = r"""
import json, os, socket, subprocess, sys, tempfile
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
mine, rank0 = 30000, 30100
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write(f"{mine} {mine}")
listener = socket.socket(); listener.bind(("127.0.0.1", rank0)); listener.listen(8)
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump([[f"127.0.0.1:{rank0}"], [f"127.0.0.1:{mine}"]], f)
os.environ.update(MLX_HOSTFILE=f.name, MLX_RANK="1")
from mlx_ring.ring.world import _hold_own_ports
held = _hold_own_ports() if sys.argv[1] == "hold" else []
out = socket.socket()
try:
    out.connect(("127.0.0.1", rank0))
    print("connected from", out.getsockname()[1])
except OSError as e:
    print("no ephemeral port", e.errno)
with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
    f.write("40000 40100")
ring = socket.socket()  # MLX's listener: SO_REUSEADDR and SO_REUSEPORT, beside the held socket
ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); ring.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
try:
    ring.bind(("127.0.0.1", mine)); ring.listen(1)
    peer = socket.create_connection(("127.0.0.1", mine)); ring.accept()
    print("listening")
except OSError as e:
    print("cannot listen", e.errno)
"""


def last_rank(mode: str) -> str:
    p = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", LAST_RANK, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or sys.platform != "linux",
    reason="a network namespace of its own needs Linux and root (CI runs as root)",
)
def test_the_last_rank_own_port_is_not_given_to_its_outgoing_connection():
    # Without the hold, the kernel gives the rank's own port away: MLX's listen would then fail
    # (EADDRINUSE), and after the rank exits, for a minute of TIME_WAIT, so would every restart.
    assert last_rank("none").splitlines() == ["connected from 30000", "cannot listen 98"]
    assert last_rank("hold").splitlines() == ["no ephemeral port 99", "listening"]


def test_a_port_another_program_holds_is_refused_naming_it(tmp_path, monkeypatch):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    port = other.getsockname()[1]
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([["127.0.0.1:1"], [f"127.0.0.1:{port}"]]))
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setattr(ring_world, "PORT_WAIT_S", 0)
    with pytest.raises(ValueError, match=f"ring port {port} on 127.0.0.1 is in use"):
        ring_world._hold_own_ports()
    other.close()
    held = ring_world._hold_own_ports()  # free again: held until MLX listens
    assert [s.getsockname()[1] for s in held] == [port]
    for s in held:
        s.close()


def test_an_address_not_on_this_host_is_refused_naming_it(tmp_path, monkeypatch):
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([["192.0.2.1:23000"]]))  # TEST-NET-1: no machine's own address
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    monkeypatch.setenv("MLX_RANK", "0")
    with pytest.raises(ValueError, match="cannot listen on its ring address 192.0.2.1:23000"):
        ring_world._hold_own_ports()


def test_a_port_below_the_ephemeral_range_is_checked_but_not_held(tmp_path, monkeypatch):
    # macOS hands out 49152-65535 only (tests/data/macos/portrange.txt): ring ports below that need
    # no hold, yet one in use is still refused in a sentence.
    mac_range = platform.parse_port_range((ROOT / "tests/data/macos/portrange.txt").read_text())
    port = free_port()  # below this machine's range, and so below 49152
    assert port < mac_range[0]
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([["127.0.0.1:1"], [f"127.0.0.1:{port}"]]))
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setattr(ring_world, "PORT_WAIT_S", 0)
    monkeypatch.setattr(ring_world, "ephemeral_ports", lambda: mac_range)
    assert ring_world._hold_own_ports() == []
    with socket.socket() as s:  # not held: free for another listener, with no socket option needed
        s.bind(("127.0.0.1", port))
        s.listen(1)
        with pytest.raises(ValueError, match=f"ring port {port} on 127.0.0.1 is in use"):
            ring_world._hold_own_ports()
    # a range that holds it
    monkeypatch.setattr(ring_world, "ephemeral_ports", lambda: (port, port))
    held = ring_world._hold_own_ports()
    assert [s.getsockname()[1] for s in held] == [port]
    for s in held:
        s.close()


JOIN = """
import sys
from mlx_ring.ring.world import init_world
world = init_world(verbose=sys.argv[1] == "1")
print("joined", world.rank(), world.size())
"""


@pytest.mark.parametrize("verbose", ["1", "0"])
def test_ring_verbose_makes_mlx_log_how_each_rank_joins(tmp_path, verbose):
    # RING_VERBOSE=1 (config.ring_verbose) for a start that hangs: MLX's own account on stderr
    first = free_port(2)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{first}"], [f"127.0.0.1:{first + 1}"]]))
    env = {k: v for k, v in os.environ.items() if k != "MLX_RING_VERBOSE"} | {
        "MLX_HOSTFILE": str(hostfile)
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN, verbose],
            cwd=ROOT,
            env=env | {"MLX_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in ranks]
    assert [o.strip() for o, _ in outs] == ["joined 0 2", "joined 1 2"], outs
    if verbose == "1":
        assert (
            "[ring] Rank 0 accepting" in outs[0][1]
            and "[ring] Rank 1 connecting to 0" in outs[1][1]
        ), outs
    else:
        assert "[ring]" not in outs[0][1] + outs[1][1], outs
