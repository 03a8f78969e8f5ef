"""The launcher's choice of mode: the all_sum over the real ring, where every host in hosts.json
runs the probe (`./launch.sh probe allsum`, planning/allsum.py) under mlx.launch on the ring's
own addresses and port, as the ranks will (cached for the planner); and the plan in the mode
PARALLEL gives or auto chooses from it. `check` measures it every time, a first `start` where
auto would otherwise guess."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_ring.config import ROOT
from mlx_ring.hostfile import Host, mlx_hostfile, read_hostfile
from mlx_ring.hosts import ssh
from mlx_ring.planning.allsum import (
    TRANSPORTS,
    fit,
    implausible,
    parse,
    remember,
    ring_allsum,
    ring_key,
)
from mlx_ring.planning.auto import plan_mode, shares_or_refusal
from mlx_ring.planning.capabilities import compute_units
from mlx_ring.planning.modes import AllSum
from mlx_ring.planning.planner import blocks_for, read_config
from mlx_ring.ring.launch import under_feed

TIMEOUT_S = 120  # the ranks start (over ssh), connect, then time 80 all_sums each of two sizes


def probe_command(hostfile: Path, port: int, hidden: int, dtype: str) -> list[str]:
    """mlx.launch running the all_sum probe on every host of `hostfile`,
    from the project's checkout."""
    launcher = str(Path(sys.executable).parent / "mlx.launch")
    return [
        launcher,
        "--backend",
        "ring",
        "--hostfile",
        str(hostfile),
        "--starting-port",
        str(port),
        "--cwd",
        str(ROOT),
        "--",
        str(ROOT / "launch.sh"),
        "probe",
        "allsum",
        str(hidden),
        dtype,
    ]


def measure_ring(
    hosts: list[Host], conf: Path, port: int, hidden: int, dtype: str, cache_dir: Path
) -> tuple[str, AllSum | None]:
    """(a line for the check's report, the all_sum as measured, or None where it could not be)."""
    if len(hosts) < 2:
        return "", None
    env = {
        **os.environ,
        "PATH": f"{ssh.BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RING_SSH_FILE": str(conf),
    }
    with tempfile.TemporaryDirectory() as d:
        hostfile = Path(d) / "hosts.json"
        hostfile.write_text(json.dumps(mlx_hostfile(hosts)))
        # A process group of its own: a rank that hangs is ended with mlx.launch,
        # on this host's side.
        p = subprocess.Popen(
            under_feed(probe_command(hostfile, port, hidden, dtype)),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
        )
        try:
            out, _ = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += f"\n(no answer within {TIMEOUT_S} s)"
    found = parse(out)
    if found is None:
        tail = (
            " ".join(out.strip().splitlines()[-3:])[-300:]
            or f"mlx.launch exited with {p.returncode}"
        )
        return f"all_sum over the ring: not measured ({tail}); the planner assumes a default", None
    # "nccl" where the hosts' CUDA GPUs would run tensor mode's all_sums
    backend = found.get("backend", "ring")
    remember(cache_dir, ring_key([h.ssh for h in hosts], backend), found)
    allsum = fit(found, TRANSPORTS[backend])
    why = implausible(found)
    return (
        f"all_sum over {'NCCL' if backend == 'nccl' else 'the ring'} ({len(hosts)} ranks): "
        f"{found['rows_1_ms']:.3f} ms for (1, {hidden}), {found['rows_64_ms']:.3f} ms for (64, "
        f"{hidden}) {dtype}: {allsum.latency_ms:.3f} ms + {allsum.gbytes_s:.2f} GB/s"
        + (
            f" (the lower quartile of {found['rounds']} rounds; their medians "
            f"{found['rows_1_median_ms']:.3f} and {found['rows_64_median_ms']:.3f} ms)"
            if "rounds" in found
            else ""
        )
        + (f"; {why}, so a start measures it again" if why else "")
    ), allsum


def choose(ring) -> None:
    """The plan in the mode PARALLEL gives or auto chooses, from what was measured (`ring`:
    preflight.py's Preflight)."""
    cfg, spec = ring.cfg, ring.spec
    config = read_config(ring.model)
    ring.split = shares_or_refusal(config, len(ring.hosts))
    ring.allsum = ring.allsum or ring_allsum(cfg.cache_dir, read_hostfile(cfg.hostfile)[0])
    ring.blocks = blocks_for(cfg, spec, config)
    try:
        ring.plan, ring.caps, ring.kept, ring.choice = plan_mode(
            spec,
            ring.measured,
            [h.keys for h in ring.hosts],
            cfg.parallel,
            cfg.strategy,
            cfg.kv_tokens,
            cfg.layers,
            cfg.prompt_cache_gb,
            split=ring.split,
            allsum=ring.allsum,
            links=ring.links,
            blocks=ring.blocks,
        )
    except ValueError as e:
        ring.problems.append(f"{e} (free memory as measured on each host now)")


def unmeasured(ring) -> bool:
    """Whether PARALLEL=auto would choose with a default all_sum where tensor mode could pay: the
    model splits and the ranks compute on more than one device."""
    return (
        not ring.problems
        and ring.cfg.parallel == "auto"
        and len(ring.hosts) > 1
        and isinstance(ring.split, list)
        and compute_units(ring.measured) > 1
        and ring.allsum is not None
        and not ring.allsum.source.startswith("measured")
    )
