"""What this machine can do: device, memory, matmul speed and memory bandwidth, measured once and
cached per host, device and dtype; and the exchange that gives every rank every rank's answer.

`MLX_RING_CAPS` (tests, or to pretend): a JSON list, one object per rank, whose keys (`host`,
`device`, `memory_gb`, `usable_gb`, `tflops`, `bandwidth_gbs`, `working_set_gb`, `unit`) replace
what this rank measures.
A rank whose entry has memory_gb, tflops and bandwidth_gbs measures nothing.
"""

import fcntl
import json
import logging
import os
import platform
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from mlx_ring.gpu import one_gpu_per_rank

# run as `./launch.sh probe` on a GPU host: before MLX starts (a server has called it already)
one_gpu_per_rank()

import mlx.core as mx  # noqa: E402

from mlx_ring import settings  # noqa: E402
from mlx_ring.gpu import own_memory, usable_bytes, usable_own, working_set  # noqa: E402
from mlx_ring.planning.capabilities import Capabilities, default_usable_gb
from mlx_ring.planning.plan import GIB
from mlx_ring.platform import memory as host_memory
from mlx_ring.platform import usable_cores

log = logging.getLogger(__name__)

CAP_KEYS = (
    "host",
    "device",
    "memory_gb",
    "usable_gb",
    "tflops",
    "bandwidth_gbs",
    "working_set_gb",
    "unit",
)
PROBE_SECONDS = 0.25  # per measurement; with warm-up the probe stays well under 2 s
ROUNDS = 5  # each measurement's rounds; the fastest is kept
# this way of timing; a speed cached by an older way (one mean over the whole
# time) is measured again
SPEED_PROBE = 2


def device_info() -> dict:
    """MLX's device info where it has one (`mx.device_info()`, older `mx.metal.device_info()`)."""
    for get in (
        getattr(mx, "device_info", None),
        getattr(getattr(mx, "metal", None), "device_info", None),
    ):
        try:
            if get is not None:
                return dict(get())
        except Exception:  # no such device in this build: fall back to the OS
            continue
    return {}


def os_memory() -> tuple[float, float]:
    """(total, available) bytes from the OS (mlx_ring.platform: /proc/meminfo,
    or sysctl and vm_stat)."""
    return host_memory()


def _timed(fn, seconds: float) -> float:
    """Seconds one fn() takes at best: after a warm-up call, ROUNDS rounds of calls for `seconds`
    in all, the fastest round's mean kept. Other work on the machine slows a round and never
    speeds one: one mean over the whole time, taken while other work ran here, had cached half
    the speed one pinned core of the same host measured later."""
    mx.eval(fn())
    best = float("inf")
    for _ in range(ROUNDS):
        n, t0 = 0, time.perf_counter()
        while True:
            mx.eval(fn())
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds / ROUNDS:
                break
        best = min(best, elapsed / n)
    return best


def measure_speed(dtype: str) -> tuple[float, float]:
    """(TFLOP/s of a square matmul in `dtype`, GB/s of reading a large array)
    on the default device."""
    dt = getattr(mx, dtype if dtype in ("float32", "float16", "bfloat16") else "float16")
    gpu = mx.default_device() != mx.cpu
    size = 2048 if gpu else 512
    a, b = mx.random.normal((size, size)).astype(dt), mx.random.normal((size, size)).astype(dt)
    tflops = 2 * size**3 / _timed(lambda: a @ b, PROBE_SECONDS) / 1e12
    # decode streams weights like this
    big = mx.ones(((512 if gpu else 64) * 2**20 // 4,), dtype=mx.float32)
    return tflops, big.nbytes / _timed(lambda: mx.sum(big), PROBE_SECONDS) / 1e9


def blas() -> str:
    """The BLAS MLX's CPU backend runs on: a figure measured under MLX's slow reference
    BLAS (a rank started without launch.sh's OpenBLAS preload) must never stand for the
    same host set up right."""
    if mx.default_device() != mx.cpu or platform.system() != "Linux":
        return ""
    maps = Path("/proc/self/maps").read_text()
    return "|openblas" if "openblas" in maps else "|reference-blas"


def compute_unit() -> str:
    """The GPU or the cores this rank has to itself on its host, "" when it shares the host's: a GPU
    of its own with CUDA_PER_RANK, else (on a CPU device) the cores it is pinned to."""
    if mx.default_device() != mx.cpu:
        return (
            f"GPU {settings.text('CUDA_VISIBLE_DEVICES')}"
            if settings.text("CUDA_PER_RANK") == "1"
            else ""
        )
    cores = usable_cores()
    return f"cores {','.join(map(str, sorted(cores)))}" if cores else ""


@contextmanager
def _one_at_a_time(path: Path):
    """Held while a rank reads or measures the speed cached in `path`: the ranks of one
    machine measure in turn, since at once they slow each other, and those after the
    first read its figure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")
    except OSError:  # a cache that cannot be written: each measures for itself
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _cached_speed(cache_dir: Path, device: str, dtype: str, unit: str = "") -> tuple[float, float]:
    """The measured speed for this host, device (or its `unit`), dtype and BLAS; measured on first
    use (and where an older way of timing cached it), then read back."""
    path = Path(cache_dir) / "probe.json"
    # pinned: its cores' speed
    share = f" ({len(unit.split(','))} cores)" if unit.startswith("cores") else ""
    key = f"{socket.gethostname()}|{device}{share}|{dtype}{blas()}"
    with _one_at_a_time(path):
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}
        if cache.get(key, {}).get("probe") == SPEED_PROBE:
            return cache[key]["tflops"], cache[key]["bandwidth_gbs"]
        t0 = time.perf_counter()
        tflops, gbs = measure_speed(dtype)
        log.info(
            "measured %s (%s): %.3f TFLOP/s, %.1f GB/s in %.2f s (cached in %s)",
            device,
            dtype,
            tflops,
            gbs,
            time.perf_counter() - t0,
            path,
        )
        cache[key] = {
            "tflops": tflops,
            "bandwidth_gbs": gbs,
            "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
            "probe": SPEED_PROBE,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)  # atomic: ranks sharing a host may write at once
        except OSError as e:
            log.warning("cannot cache the probe in %s: %s", path, e)
        return tflops, gbs


def env_override(rank: int) -> dict:
    """This rank's entry of MLX_RING_CAPS, checked."""
    raw = settings.text("MLX_RING_CAPS")
    if not raw:
        return {}
    try:
        rows = json.loads(raw)
        row = rows[rank] if rank < len(rows) else {}
        assert isinstance(row, dict)
    except (json.JSONDecodeError, AssertionError, TypeError, KeyError):
        raise ValueError(
            "MLX_RING_CAPS must be a JSON list of objects, one per rank, e.g. "
            '[{"memory_gb": 48, "tflops": 30, "bandwidth_gbs": 400}, ...]'
        ) from None
    unknown = set(row) - set(CAP_KEYS)
    if unknown:
        raise ValueError(
            (
                f"MLX_RING_CAPS rank {rank} has unknown keys {sorted(unknown)}; use "
                f"{', '.join(CAP_KEYS)}"
            )
        )
    return row


def local_capabilities(cache_dir: Path, dtype: str, rank: int = 0) -> Capabilities:
    """This rank's machine: MLX_RING_CAPS where it says, measured (speed cached) for the rest."""
    over = env_override(rank)
    info = device_info()
    device = over.get("device") or str(info.get("device_name") or mx.default_device())
    host = over.get("host") or socket.gethostname()
    unit = over.get("unit", compute_unit())
    limit = over.get("working_set_gb", working_set(info) / GIB)
    if "memory_gb" in over:
        total = over["memory_gb"]
        usable = over.get("usable_gb", usable_bytes(default_usable_gb(total), limit))
    elif own := own_memory(info):  # CUDA: the GPU's own memory holds the slice, not the host's
        total = own[0] / GIB
        usable = over.get("usable_gb", usable_own(*own) / GIB)
    else:
        os_total, os_avail = os_memory()
        total = (info.get("memory_size") or os_total) / GIB
        # Metal: the GPU may wire at most the recommended working set; everywhere: what is free now.
        usable = over.get("usable_gb", usable_bytes(os_avail, limit * GIB) / GIB)
    if "tflops" in over and "bandwidth_gbs" in over:
        tflops, gbs = over["tflops"], over["bandwidth_gbs"]
    else:
        tflops, gbs = _cached_speed(cache_dir, device, dtype, unit)
        tflops, gbs = over.get("tflops", tflops), over.get("bandwidth_gbs", gbs)
    return Capabilities(
        host,
        float(total),
        float(usable),
        float(tflops),
        float(gbs),
        device,
        source="MLX_RING_CAPS" if over else "probed",
        working_set_gb=float(limit),
        unit=unit,
    )


def main() -> None:
    """`./launch.sh probe DTYPE RANK` on a host: its capabilities as JSON (the launcher plans
    with them); `./launch.sh probe allsum HIDDEN DTYPE` on every rank under mlx.launch: the
    ring's all_sum (allsum.py)."""
    import sys
    from dataclasses import asdict

    from mlx_ring.config import parse_config

    logging.basicConfig(level=logging.WARNING)
    if sys.argv[1:2] == ["allsum"]:
        from mlx_ring.planning.allsum import main as allsum

        return allsum(sys.argv[2:])
    cfg, _ = parse_config([])
    dtype, rank = sys.argv[1], int(sys.argv[2])
    print(json.dumps(asdict(local_capabilities(cfg.cache_dir, dtype, rank))))


if __name__ == "__main__":
    main()
