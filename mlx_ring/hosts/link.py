"""The link between each pair of ring neighbours, measured the way the ring uses it: rank i+1
listens on its own ring address and port (so the port is free there and reachable), rank i
connects from its host, times small round trips, then streams a block of bytes."""

import json
import subprocess
import threading
import time
from pathlib import Path

from mlx_ring.hosts import ssh

BLOCK_MB = 64  # the most a bandwidth measurement sends
SECONDS = 2.0  # and the longest it sends for: a slow link is measured on less, not for longer
SLOW_GBIT = 0.1  # below this a link is called slow
ROOT = Path(__file__).resolve().parents[2]

# PYTHON -c LINK serve ADDR PORT | PYTHON -c LINK measure ADDR PORT MB, with PYTHON the project's
# environment on that host (never the system's python3: on a Mac without Xcode's tools it is a stub
# that opens an install dialog). Stdlib only.
LINK = r"""
import errno, json, socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for wait in range(50):  # a rank of a ring just stopped may hold the port a moment longer
        try:
            s.bind((addr, port)); break
        except OSError as e:
            if wait == 49 or e.errno != errno.EADDRINUSE:  # 98 on Linux, 48 on macOS
                hint = " (is the ring running? ./launch.sh stop)" if e.errno == errno.EADDRINUSE else ""
                print(json.dumps({"error": f"cannot listen on {addr}:{port} ({e.strerror}){hint}"})); sys.exit(0)
            time.sleep(0.1)
    s.listen(1); s.settimeout(20); print(json.dumps({"listening": True}), flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(20):
        c.sendall(c.recv(1))
    want, got = int.from_bytes(c.recv(8), "big"), 0
    while got < want:
        chunk = c.recv(1 << 20)
        if not chunk:  # the sender's time was up: a slow link sends less, not for longer
            break
        got += len(chunk)
    c.sendall(got.to_bytes(8, "big"))
else:
    mb = int(sys.argv[4])
    deadline = time.time() + 10
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=5); break
        except OSError as e:
            if time.time() > deadline:
                print(json.dumps({"error": f"cannot connect to {addr}:{port} ({e.strerror or e})"})); sys.exit(0)
            time.sleep(0.2)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(20):
        t = time.perf_counter(); c.sendall(b"p"); c.recv(1); rtts.append(time.perf_counter() - t)
    block, most, seconds = bytes(1 << 18), mb << 20, float(sys.argv[5])
    c.sendall(most.to_bytes(8, "big"))
    t, sent = time.perf_counter(), 0
    while sent < most and time.perf_counter() - t < seconds:
        c.sendall(block)
        sent += len(block)
    c.shutdown(socket.SHUT_WR)
    c.settimeout(60)
    got = b""
    while len(got) < 8:
        more = c.recv(8 - len(got))
        if not more:
            print(json.dumps({"error": f"{addr}:{port} closed the link mid-measurement"})); sys.exit(0)
        got += more
    dt, got = time.perf_counter() - t, int.from_bytes(got, "big")
    print(json.dumps({"rtt_ms": sorted(rtts)[len(rtts) // 2] * 1e3, "gbit_s": got * 8 / dt / 1e9, "mb": got / 2**20}))
"""


# $1 the environment's Python, then its arguments; a host without it answers in
# the probe's own JSON.
RUN = (
    'py=$1; shift; [ -x "$py" ] || { printf \'{"error": "no project environment at %s (./launch.sh '
    'setup there)"}\\n\' "$py"; '
    'exit 0; }; exec "$py" -c "$@"'
)


def measure_pair(
    conf, sender, receiver, mb: int = BLOCK_MB, root: Path = ROOT, seconds: float = SECONDS
) -> dict:
    """{rtt_ms, gbit_s, mb} from `sender`'s host to `receiver`'s ring address, or
    {error}; the probes run under the project's environment at `root` on each host, for
    about `seconds` at most."""
    result, python = {}, ssh.env_python(root)

    def run(node, *args, timeout):
        try:
            p = ssh.run_on(conf, node.ssh, node.local, RUN, (python, LINK, *args), timeout=timeout)
        except subprocess.TimeoutExpired:
            return [
                {"error": f"{node.ssh} did not finish the link measurement within {timeout} s"}
            ], ""
        except ValueError as e:  # ssh.SshError: the host itself did not answer
            return [{"error": str(e)}], ""
        return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")], p.stderr

    def serve():
        lines, _ = run(receiver, "serve", receiver.address, receiver.port, timeout=40)
        result["serve"] = next((x for x in lines if "error" in x), None)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    time.sleep(0.5)  # the listener's ssh session starts first; the client retries meanwhile anyway
    lines, err = run(sender, "measure", receiver.address, receiver.port, mb, seconds, timeout=60)
    t.join(30)
    if result.get("serve"):
        return result["serve"]
    return lines[-1] if lines else {"error": (err.strip() or "no answer")[-200:]}


def measure_links(ring) -> tuple[str, list[tuple[float, float]]]:
    """One line per neighbour pair (round trip and bandwidth, or what is wrong and what to do), and
    every hop of a trip round the ring as (rtt ms, Gbit/s): a ring of two crosses its link twice."""
    hosts, lines, hops = ring.hosts, [], []
    if len(hosts) < 2:
        return "links: one rank, no links", []
    for i, a in enumerate(hosts):
        b = hosts[(i + 1) % len(hosts)]
        if len(hosts) == 2 and i == 1:
            break  # a ring of two has one link
        r = measure_pair(ring.conf, a, b)
        if "error" in r:
            ring.problems.append(
                f"rank {a.rank} ({a.ssh}) cannot reach rank {b.rank} ({b.ssh}) at its ring "
                f"address: {r['error']}; check the address in hosts.json and that no "
                "firewall blocks the port"
            )
            lines.append(
                f"link {a.rank} -> {b.rank} ({a.ssh} -> {b.address}:{b.port}): FAILED, {r['error']}"
            )
        else:
            slow = (
                (
                    f" (slow: below {SLOW_GBIT * 1000:.0f} Mbit/s, prompts take long to cross it; "
                    "a wired or Thunderbolt link is faster)"
                )
                if r["gbit_s"] < SLOW_GBIT
                else ""
            )
            lines.append(
                f"link {a.rank} -> {b.rank} ({a.ssh} -> {b.address}:{b.port}): round trip "
                f"{r['rtt_ms']:.3f} ms, {r['gbit_s']:.2f} Gbit/s{slow}"
            )
            hops += [(r["rtt_ms"], r["gbit_s"])] * (2 if len(hosts) == 2 else 1)
    return "\n".join(lines), hops
