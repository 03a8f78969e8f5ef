"""What each rank can hold and do, as the layer plan takes it: measured or declared in hosts.json,
and shared between ranks on one host. Pure, no MLX."""

from dataclasses import dataclass, replace

from mlx_ring.hostfile import HOST_KEYS


@dataclass(frozen=True)
class Capabilities:
    """One rank's machine, as probed at startup or declared in hosts.json."""

    host: str
    memory_gb: float  # total memory (GiB)
    usable_gb: float  # what this rank may fill: weights, KV cache and runtime (GiB)
    tflops: float  # matmul speed in the model's dtype (10**12 FLOP/s)
    # memory bandwidth (10**9 bytes/s); one decoded token reads every weight once
    bandwidth_gbs: float
    device: str = ""
    layers: int | None = None  # custom: exactly this many layers
    weight: float | None = None  # custom: this rank's share of the layers not fixed by `layers`
    source: str = "probed"
    # Metal's recommended working set (GiB): the most the GPU may wire; 0: none
    working_set_gb: float = 0.0
    # the GPU or the cores this rank has to itself on its host ("": it shares the host's)
    unit: str = ""


def default_usable_gb(memory_gb: float) -> float:
    """macOS lets the GPU wire about 2/3 of RAM up to 36 GiB and 3/4 above (its default wired limit;
    newer Macs report more above, e.g. 107.5 of 128 GiB, so this errs small)."""
    return memory_gb * (0.75 if memory_gb > 36 else 2 / 3)


NUMBER_KEYS = ("memory_gb", "usable_gb", "max_memory_gb", "tflops", "bandwidth_gbs", "weight")


def declared(host: str, entry: dict) -> Capabilities | None:
    """A host's capabilities from its hosts.json keys alone, if it has the three that matter."""
    if not all(k in entry for k in ("memory_gb", "tflops", "bandwidth_gbs")):
        return None
    return with_host_keys(Capabilities(host, 1.0, 1.0, 1.0, 1.0, source="hosts.json"), entry)


def with_host_keys(cap: Capabilities, entry: dict) -> Capabilities:
    """hosts.json keys win over what was measured; `max_memory_gb` caps what the plan may fill."""
    where = f"hosts.json entry of {cap.host}"
    for k in NUMBER_KEYS:
        if k in entry and (
            not isinstance(entry[k], (int, float)) or isinstance(entry[k], bool) or entry[k] <= 0
        ):
            raise ValueError(f"{where}: {k} must be a positive number, got {entry[k]!r}")
    if "layers" in entry and (not isinstance(entry["layers"], int) or entry["layers"] < 1):
        raise ValueError(
            f"{where}: layers must be a whole number of at least 1, got {entry['layers']!r}"
        )
    if not any(k in entry for k in HOST_KEYS):
        return cap
    memory = float(entry.get("memory_gb", cap.memory_gb))
    usable = float(
        entry.get("usable_gb", default_usable_gb(memory) if "memory_gb" in entry else cap.usable_gb)
    )
    usable = min(usable, float(entry.get("max_memory_gb", usable)))
    # a probed Mac: its GPU wires no more than Metal allows, whatever is declared
    if cap.working_set_gb:
        usable = min(usable, cap.working_set_gb)
    measured = any(k in entry for k in ("memory_gb", "usable_gb", "tflops", "bandwidth_gbs"))
    return replace(
        cap,
        memory_gb=memory,
        usable_gb=usable,
        tflops=float(entry.get("tflops", cap.tflops)),
        bandwidth_gbs=float(entry.get("bandwidth_gbs", cap.bandwidth_gbs)),
        device=entry.get("device", cap.device),
        layers=entry.get("layers", cap.layers),
        weight=entry.get("weight", cap.weight),
        source="hosts.json" if measured else cap.source,
    )


def memory_pool(c: Capabilities) -> tuple[str, str]:
    """The memory a rank fills: its host's, shared with the host's other ranks, or its own GPU's."""
    return (c.host, c.unit) if c.unit.startswith("GPU") else (c.host, "")


def colocate(caps: list[Capabilities]) -> list[Capabilities]:
    """Ranks on one host share its memory and its speed: each gets its share of the memory it
    fills (the host's, or a GPU's of its own: `memory_pool`) and the first such rank's speed, so
    the plan does not chase measurement noise between them."""
    first: dict[str, Capabilities] = {}
    count: dict[str, int] = {}
    pools: dict[tuple[str, str], list[Capabilities]] = {}
    for c in caps:
        first.setdefault(c.host, c)
        count[c.host] = count.get(c.host, 0) + 1
        pools.setdefault(memory_pool(c), []).append(c)
    out = []
    for c in caps:
        f, k = first[c.host], count[c.host]
        pool = pools[memory_pool(c)]
        out.append(
            c
            if k == 1
            else replace(
                c,
                tflops=f.tflops,
                bandwidth_gbs=f.bandwidth_gbs,
                device=f.device,
                usable_gb=min(c.usable_gb, pool[0].usable_gb / len(pool)),
            )
        )
    return out


def compute_units(caps: list[Capabilities]) -> int:
    """How many devices the ranks compute on: ranks on one host take turns on its cores (or its one
    GPU) unless each has a GPU or cores of its own (its `unit`), so together they count once."""
    return len({(c.host, c.unit) for c in caps})
