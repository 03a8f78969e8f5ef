"""What an all_sum costs over the ring's own links, measured: every rank sums a small `(1,
hidden)` and a larger `(64, hidden)` array, all_sums chained in one graph as a model's layers
issue them; the lower quartile of each size's rounds gives a latency and a bandwidth (a line
through the two), cached per ring in `CACHE_DIR/allsum.json` beside the probe's speeds.
PARALLEL=auto reads it; `./launch.sh check` measures it under mlx.launch on every host
(`./launch.sh probe allsum`), and a ring that starts without one (or with one `implausible` says
to measure again) measures it once at startup.

Run by hand: `mlx.launch --backend ring --hostfile hosts.json -- ./launch.sh
probe allsum HIDDEN DTYPE`.
"""

import json
import logging
import os
import time
from pathlib import Path

from mlx_ring.hostfile import ring_backend
from mlx_ring.planning.modes import DEFAULT_ALLSUM, AllSum

log = logging.getLogger(__name__)

ROWS = (1, 64)  # one stream's hidden state, and a batch's
ROUNDS = 12  # timed rounds of each size, the two sizes taking turns
WARMUP = 2  # untimed rounds first: the rounds right after connecting run far slower
# all_sums in one graph, one after the other, of each size: latency needs the longer chain
CHAIN = (16, 4)
# past this (warm-up included), the timing stops after the round in hand: `check` on a
# slow link stays quick
BUDGET_S = 1.5
# this way of timing; a figure cached by an older way (a median of 5 rounds, no
# warm-up) is measured again
PROBE = 2
TRANSPORTS = {
    "ring": "ring (TCP)",
    "jaccl": "JACCL (Thunderbolt)",
    "jaccl-ring": "JACCL (Thunderbolt)",
    "nccl": "NCCL",
}


def kept(ms: list[float]) -> float:
    """The figure a size's rounds give: their lower quartile. A stall (another process on a
    rank's core, a rank still starting) slows a round and never speeds one, and a step on a quiet
    ring pays what the quiet rounds paid: on 2 pinned CPU ranks over loopback, rounds of 0.1 ms
    next to 9 ms."""
    return sorted(ms)[len(ms) // 4]


def measure(world, hidden: int, dtype: str = "bfloat16", rounds: int = ROUNDS) -> dict:
    """Collective (every rank calls it): milliseconds one all_sum of `(rows, hidden)` takes for
    each of ROWS, as this rank saw them (`kept` of its rounds, and their median). The all_sums
    are chained in one graph, each on the last one's result, as a model's layers issue them: an
    all_sum evaluated alone also pays a trip to the host and back (on 2 x H100 over NCCL 0.10 ms
    alone, 0.047 ms chained). The sizes take turns, so a burst of other work slows both alike. A
    slow link is timed on fewer rounds: the ranks agree after each whether one of them is past
    BUDGET_S, so all run the same collectives."""
    import mlx.core as mx

    from mlx_ring.tensor.sums import summing

    dt = getattr(mx, dtype if dtype in ("float32", "float16", "bfloat16") else "float16")
    out = {
        "hidden": hidden,
        "dtype": dtype,
        "ranks": world.size(),
        "bytes_per_element": dt.size,
        "probe": PROBE,
    }
    xs = {rows: mx.ones((rows, hidden), dtype=dt) for rows in ROWS}
    all_sum = summing(world)  # the layers' own

    def chained(x, chain):
        for _ in range(chain):
            x = all_sum(x) * (1 / world.size())  # stays ones: no overflow
        return x

    ts: dict[int, list[float]] = {rows: [] for rows in ROWS}
    start, done = time.perf_counter(), 0
    while done < WARMUP + rounds:
        for rows, chain in zip(ROWS, CHAIN):
            t = time.perf_counter()
            mx.eval(chained(xs[rows], chain))
            if done >= WARMUP:
                ts[rows].append((time.perf_counter() - t) * 1e3 / chain)
        done += 1
        late = mx.array([1.0 if done > WARMUP and time.perf_counter() - start > BUDGET_S else 0.0])
        if mx.distributed.all_sum(late, group=world).item() > 0:
            break
    for rows in ROWS:
        out[f"rows_{rows}_ms"] = kept(ts[rows])
        out[f"rows_{rows}_median_ms"] = sorted(ts[rows])[len(ts[rows]) // 2]
    out["rounds"] = len(ts[ROWS[0]])
    return out


def implausible(result: dict) -> str:
    """Why a measured result cannot stand for what a step pays ("" where it can): taken by an older
    way of timing, or a `(1, hidden)` array that took more than twice as long as one 64 times its
    size, which says stalls, not the link, were timed."""
    if result.get("probe") != PROBE:
        return "measured by an older probe that kept a median of 5 rounds without a warm-up"
    one, many = result[f"rows_{ROWS[0]}_ms"], result[f"rows_{ROWS[1]}_ms"]
    if one > 2 * many:
        return (
            f"{one:.3g} ms for (1, {result['hidden']}) against {many:.3g} ms for ({ROWS[1]}, "
            f"{result['hidden']}): stalls were timed, not the link"
        )
    return ""


def fit(result: dict, transport: str = "ring (TCP)", when: str = "") -> AllSum:
    """The latency and bandwidth through the two measured sizes (`measure`'s result)."""
    small = result["hidden"] * result["bytes_per_element"]
    big = ROWS[1] * small
    t1, t64 = result[f"rows_{ROWS[0]}_ms"] / 1e3, result[f"rows_{ROWS[1]}_ms"] / 1e3
    # A bigger array that took no longer says the link's bandwidth is beyond what was measured.
    gbs = (big - small) / (t64 - t1) / 1e9 if t64 > t1 else (big - small) / max(t64, 1e-6) / 1e9
    latency = max(t1 - small / (gbs * 1e9), 0.0)
    return AllSum(
        round(latency * 1e3, 4),
        round(gbs, 3),
        int(result["ranks"]),
        transport,
        f"measured on this ring{' ' + when if when else ''}: {result[f'rows_{ROWS[0]}_ms']:.3g} "
        f"ms for (1, {result['hidden']}), {result[f'rows_{ROWS[1]}_ms']:.3g} ms for "
        f"({ROWS[1]}, {result['hidden']})",
    )


def parse(output: str) -> dict | None:
    """The probe's result from its output (the last line that is one), or None."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"allsum"' in line:
            try:
                found = json.loads(line)["allsum"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(found, dict) and all(f"rows_{r}_ms" in found for r in ROWS):
                return found
    return None


def ring_key(hosts: list[str], backend: str = "ring") -> str:
    """What names a ring's links: its backend and its hosts in ring order."""
    return f"{backend}|{','.join(hosts)}"


def _path(cache_dir: Path) -> Path:
    return Path(cache_dir).expanduser() / "allsum.json"


def cached(cache_dir: Path, key: str) -> AllSum | None:
    """The all_sum measured on the ring `key`, if it was and the figure is not `implausible`."""
    try:
        row = json.loads(_path(cache_dir).read_text()).get(key)
        if row and (why := implausible(row)):
            log.info("the all_sum cached for %s is measured again: %s", key, why)
            return None
        return (
            fit(row, TRANSPORTS.get(key.split("|", 1)[0], "ring (TCP)"), row.get("measured", ""))
            if row
            else None
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None


def remember(cache_dir: Path, key: str, result: dict) -> None:
    """Keep `result` for the ring `key` (atomic: ranks or a check may write at once)."""
    path = _path(cache_dir)
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        rows = {}
    rows[key] = result | {"measured": time.strftime("%Y-%m-%d %H:%M")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(path)
    except OSError as e:
        log.warning("cannot cache the all_sum measurement in %s: %s", path, e)


def backend_of(entries: list[dict]) -> str:
    """The backend a ring of these hosts.json entries runs its collectives on, as
    `hostfile.ring_backend` chooses it: "jaccl" (a full mesh or a ring of RDMA devices alike),
    else "ring" (MLX's, over TCP)."""
    return "jaccl" if ring_backend(entries).startswith("jaccl") else "ring"


def ring_allsum(cache_dir: Path, entries: list[dict], backend: str = "") -> AllSum:
    """The all_sum measured on the ring of these hosts.json entries, else the default for its
    backend. `backend`: the one tensor mode's all_sums go over, where the caller knows it (a
    rank: "nccl" on CUDA GPUs, `sums.nccl_sums`); else one measured over NCCL on these hosts wins
    (only CUDA hosts measure one), then the hostfile's."""
    hosts = [str(e.get("ssh", "")) for e in entries]
    backends = [backend] if backend else ["nccl", backend_of(entries)]
    for b in backends:
        if found := cached(cache_dir, ring_key(hosts, b)):
            return found
    return DEFAULT_ALLSUM[backends[-1]]


def main(argv: list[str]) -> None:
    """`./launch.sh probe allsum HIDDEN DTYPE` on every rank under mlx.launch: rank 0
    prints `{"allsum": {...}}`."""
    from mlx_ring.ring.leftovers import drop_hostfile
    from mlx_ring.ring.world import init_world, ring_description
    from mlx_ring.tensor.sums import sum_group

    hidden, dtype = int(argv[0]), argv[1]
    # Joined as a rank joins: among the rest, its stdin closed, without which mlx.launch
    # spins a core watching it, and on 2 cores the all_sums then timed the ranks' waits for a
    # core, not the link.
    world = init_world()
    description = ring_description()  # NCCL's group forms from it on CUDA GPUs, as a server's does
    # mlx.launch's temporary hostfile, read by now, as the ranks of a ring drop theirs
    drop_hostfile()
    group = sum_group(world, description)  # what tensor mode's all_sums would run over
    result = measure(group, hidden, dtype) | {"backend": "ring" if group is world else "nccl"}
    if world.rank() == 0:
        print(json.dumps({"allsum": result}), flush=True)
