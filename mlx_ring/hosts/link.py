"""The link between each pair of ring neighbours, measured the way the ring uses it: rank i+1
listens on its own ring address and port (so the port is free there and reachable), rank i
connects from its host, times small round trips, then streams a block of bytes."""

import json
import threading
import time
from pathlib import Path

from mlx_ring.hosts import ssh

BLOCK_MB = 64
ROOT = Path(__file__).resolve().parents[2]

# PYTHON -c LINK serve ADDR PORT | PYTHON -c LINK measure ADDR PORT MB, with PYTHON the project's
# environment on that host (never the system's python3: on a Mac without Xcode's tools it is a stub
# that opens an install dialog). Stdlib only.
LINK = r'''
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
        got += len(c.recv(1 << 20))
    c.sendall(b"k")
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
    block = bytes(1 << 20)
    c.sendall((mb << 20).to_bytes(8, "big"))
    t = time.perf_counter()
    for _ in range(mb):
        c.sendall(block)
    c.recv(1)
    dt = time.perf_counter() - t
    print(json.dumps({"rtt_ms": sorted(rtts)[len(rtts) // 2] * 1e3, "gbit_s": mb * 8 * 1.048576e6 / dt / 1e9}))
'''


# $1 the environment's Python, then its arguments; a host without it answers in the probe's own JSON.
RUN = ('py=$1; shift; [ -x "$py" ] || { printf \'{"error": "no project environment at %s (./launch.sh setup there)"}\\n\' "$py"; '
       'exit 0; }; exec "$py" -c "$@"')


def measure_pair(conf, sender, receiver, mb: int = BLOCK_MB, root: Path = ROOT) -> dict:
    """{rtt_ms, gbit_s} from `sender`'s host to `receiver`'s ring address, or {error}; the probes run
    under the project's environment at `root` on each host."""
    result, python = {}, ssh.env_python(root)

    def serve():
        p = ssh.run_on(conf, receiver.ssh, receiver.local, RUN, (python, LINK, "serve", receiver.address, receiver.port),
                       timeout=40)
        lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        result["serve"] = next((x for x in lines if "error" in x), None)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    time.sleep(0.5)  # the listener's ssh session starts first; the client retries meanwhile anyway
    p = ssh.run_on(conf, sender.ssh, sender.local, RUN, (python, LINK, "measure", receiver.address, receiver.port, mb),
                   timeout=60)
    t.join(30)
    if result.get("serve"):
        return result["serve"]
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return lines[-1] if lines else {"error": (p.stderr.strip() or "no answer")[-200:]}


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
            ring.problems.append(f"rank {a.rank} ({a.ssh}) cannot reach rank {b.rank} ({b.ssh}) at its ring address: "
                                 f"{r['error']}; check the address in hosts.json and that no firewall blocks the port")
            lines.append(f"link {a.rank} -> {b.rank} ({a.ssh} -> {b.address}:{b.port}): FAILED, {r['error']}")
        else:
            lines.append(f"link {a.rank} -> {b.rank} ({a.ssh} -> {b.address}:{b.port}): round trip "
                         f"{r['rtt_ms']:.3f} ms, {r['gbit_s']:.2f} Gbit/s")
            hops += [(r["rtt_ms"], r["gbit_s"])] * (2 if len(hosts) == 2 else 1)
    return "\n".join(lines), hops
