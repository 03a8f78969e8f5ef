"""`./launch.sh check`'s all_sum over the real ring: every host in hosts.json runs the probe
(`./launch.sh probe allsum`, planning/allsum.py) under mlx.launch on the ring's own addresses and port,
as the ranks will, and the result is cached for the planner (PARALLEL=auto)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_ring.config import ROOT
from mlx_ring.hostfile import Host, mlx_hostfile
from mlx_ring.hosts import ssh
from mlx_ring.planning.allsum import fit, parse, remember, ring_key
from mlx_ring.planning.modes import AllSum
from mlx_ring.ring.launch import under_feed

TIMEOUT_S = 120  # the ranks start (over ssh), connect, then time 80 all_sums each of two sizes


def probe_command(hostfile: Path, port: int, hidden: int, dtype: str) -> list[str]:
    """mlx.launch running the all_sum probe on every host of `hostfile`, from the project's checkout."""
    launcher = str(Path(sys.executable).parent / "mlx.launch")
    return [launcher, "--backend", "ring", "--hostfile", str(hostfile), "--starting-port", str(port),
            "--cwd", str(ROOT), "--", str(ROOT / "launch.sh"), "probe", "allsum", str(hidden), dtype, "ring"]


def measure_ring(hosts: list[Host], conf: Path, port: int, hidden: int, dtype: str,
                 cache_dir: Path) -> tuple[str, AllSum | None]:
    """(a line for the check's report, the all_sum as measured, or None where it could not be)."""
    if len(hosts) < 2:
        return "", None
    env = {**os.environ, "PATH": f"{ssh.BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RING_SSH_FILE": str(conf)}
    with tempfile.TemporaryDirectory() as d:
        hostfile = Path(d) / "hosts.json"
        hostfile.write_text(json.dumps(mlx_hostfile(hosts)))
        # A process group of its own: a rank that hangs is ended with mlx.launch, on this host's side.
        p = subprocess.Popen(under_feed(probe_command(hostfile, port, hidden, dtype)), cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, process_group=0)
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += f"\n(no answer within {TIMEOUT_S} s)"
    found = parse(out)
    if found is None:
        tail = " ".join(out.strip().splitlines()[-3:])[-300:] or f"mlx.launch exited with {p.returncode}"
        return f"all_sum over the ring: not measured ({tail}); the planner assumes a default", None
    remember(cache_dir, ring_key([h.ssh for h in hosts], "ring"), found)
    allsum = fit(found)
    return (f"all_sum over the ring ({len(hosts)} ranks): {found['rows_1_ms']:.3f} ms for (1, {hidden}), "
            f"{found['rows_64_ms']:.3f} ms for (64, {hidden}) {dtype}: {allsum.latency_ms:.3f} ms + "
            f"{allsum.gbytes_s:.2f} GB/s"), allsum
