"""Each STRATEGY's layer counts (`plan_layers`), and the check that a plan fits every rank's memory,
whose error names the host and the fix. Pure, no MLX.
"""

import heapq
import math

from mlx_ring.gpu import most_wired_mb, wired_limit_mb
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import (
    fixed_bytes,
    host_seconds,
    layer_kv_bytes,
    layer_seconds,
    max_layers,
    memory_need,
    per_layer_bytes,
    runtime_bytes,
)
from mlx_ring.planning.plan import (
    GIB,
    LayerPlan,
    ModelSpec,
    plan_from_sizes,
    proportional_sizes,
    uniform_plan,
)

STRATEGIES = ("balanced", "uniform", "memory", "compute", "custom")


def plan_layers(
    model: ModelSpec,
    caps: list[Capabilities],
    strategy: str = "balanced",
    kv_tokens: int = 8192,
    sizes: list[int] | None = None,
) -> LayerPlan:
    """The plan for `strategy`, checked against every rank's memory (ValueError naming the host).

    `sizes` (from LAYERS=) fixes the counts whatever the strategy, as `custom` with explicit counts.
    """
    n, L = len(caps), model.n_layers
    if strategy not in STRATEGIES:
        raise ValueError(f"STRATEGY={strategy!r} is not known; use one of {', '.join(STRATEGIES)}")
    for c in caps:
        if min(c.usable_gb, c.tflops, c.bandwidth_gbs) <= 0:
            raise ValueError(
                f"host {c.host}: capabilities must be positive, got usable {c.usable_gb} GB, "
                f"{c.tflops} TFLOP/s, {c.bandwidth_gbs} GB/s; fix its keys in hosts.json"
            )
    if sizes is not None:
        if len(sizes) != n:
            raise ValueError(
                f"LAYERS names {len(sizes)} ranks but the ring has {n}; give one count per host"
            )
        plan = plan_from_sizes(L, list(sizes), "custom")
    elif strategy == "uniform":
        plan = uniform_plan(L, n)
    elif strategy == "memory":
        room = [
            max(0.0, c.usable_gb * GIB - fixed_bytes(model, c, r, 0, kv_tokens))
            for r, c in enumerate(caps)
        ]
        plan = plan_from_sizes(L, proportional_sizes(L, room), strategy)
    elif strategy == "compute":
        plan = plan_from_sizes(L, proportional_sizes(L, [c.tflops for c in caps]), strategy)
    elif strategy == "custom":
        plan = plan_from_sizes(L, custom_sizes(L, caps), strategy)
    else:
        plan = plan_from_sizes(L, balanced_sizes(model, caps, kv_tokens), strategy)
    try:
        check_fits(model, caps, plan, kv_tokens)
    except ValueError as e:
        if strategy == "balanced" and sizes is None:
            raise
        try:  # say whether letting the planner size the slices would do
            fit = "/".join(map(str, balanced_sizes(model, caps, kv_tokens)))
            hint = f"STRATEGY=balanced{' without LAYERS' if sizes else ''} fits it as {fit} layers"
        except ValueError:
            hint = (
                "no split fits: add a host, pick a smaller or more quantized "
                "model, or lower KV_TOKENS"
            )
        raise ValueError(f"{e}; {hint}") from None
    return plan


def custom_sizes(n_layers: int, caps: list[Capabilities]) -> list[int]:
    """Hosts with `layers` get exactly that many; the rest share what is left
    by `weight` (default 1)."""
    fixed = sum(c.layers for c in caps if c.layers is not None)
    free = [r for r, c in enumerate(caps) if c.layers is None]
    left = n_layers - fixed
    if (
        (not free and left != 0)
        or (free and left < len(free))
        or any(c.layers is not None and c.layers < 1 for c in caps)
    ):
        raise ValueError(
            f"the `layers` keys in hosts.json give {fixed} of the model's {n_layers} layers to "
            f"{len(caps) - len(free)} hosts, leaving {left} for {len(free)} others; "
            "make them add up (every host needs at least one layer)"
        )
    shares = (
        proportional_sizes(
            left, [caps[r].weight if caps[r].weight is not None else 1.0 for r in free]
        )
        if free
        else []
    )
    out = [c.layers for c in caps]
    for r, s in zip(free, shares):
        out[r] = s
    return out


def balanced_sizes(model: ModelSpec, caps: list[Capabilities], kv_tokens: int) -> list[int]:
    """Minimise the busiest machine's predicted time per token within every rank's memory.

    Greedy: every rank starts with one layer, then each next layer goes where it leaves its machine
    least busy (ties: the rank with fewer layers, then the lower rank). For identical layers on
    machines of fixed speed this is optimal (it takes the smallest possible finishing times first).
    """
    n, L = len(caps), model.n_layers
    cap = [max_layers(model, c, r, kv_tokens) for r, c in enumerate(caps)]
    if L < n:
        uniform_plan(L, n)  # raises the usual message
    if min(cap) < 1 or sum(cap) < L:
        raise ValueError(_does_not_fit(model, caps, cap, kv_tokens))
    sizes = [1] * n
    busy = host_seconds(model, caps, sizes)
    per = [layer_seconds(model, c) for c in caps]
    heap = [(busy[c.host, c.unit] + per[r], 1, r) for r, c in enumerate(caps) if cap[r] > 1]
    heapq.heapify(heap)
    for _ in range(L - n):
        while True:  # entries go stale when a machine's other rank took a layer meanwhile
            t, k, r = heapq.heappop(heap)
            h = caps[r].host, caps[r].unit
            if k == sizes[r] and t == busy[h] + per[r]:
                break
            heapq.heappush(heap, (busy[h] + per[r], sizes[r], r))
        sizes[r] += 1
        busy[h] += per[r]
        if sizes[r] < cap[r]:
            heapq.heappush(heap, (busy[h] + per[r], sizes[r], r))
    return sizes


# --- checks ----------------------------------------------------------------------------------


def _gb(b: float) -> str:
    return f"{b / GIB:.1f} GB"


def _does_not_fit(
    model: ModelSpec, caps: list[Capabilities], cap: list[int], kv_tokens: int
) -> str:
    each = "; ".join(
        f"{c.host} (rank {r}) holds at most {cap[r]} in {c.usable_gb:.1f} GB usable"
        + (
            f" (its GPU may wire {c.working_set_gb:.1f} of {c.memory_gb:.0f} GB)"
            if c.working_set_gb
            else ""
        )
        for r, c in enumerate(caps)
    )
    need = memory_need(model, caps[0], 0, model.n_layers, kv_tokens) + sum(
        runtime_bytes(model, c, r, 0, kv_tokens) for r, c in enumerate(caps) if r
    )
    have = sum(c.usable_gb for c in caps) * GIB
    raise_limits = _raise_metal_limits(caps, need - have + per_layer_bytes(model, kv_tokens))
    return (
        f"the model does not fit: its {model.n_layers} layers of {_gb(model.layer_bytes)} (+ "
        f"{_gb(model.ends_bytes)} embedding and head on rank 0, KV cache for {kv_tokens} tokens) "
        f"need {_gb(need)} in all, the hosts have {_gb(have)}: {each}. Add a host, pick a smaller "
        "or more quantized model, or lower KV_TOKENS"
        + (
            (
                "; or let the Macs' GPUs wire more than Metal's recommended "
                f"working set: {raise_limits}"
            )
            if raise_limits
            else ""
        )
    )


def _raise_metal_limits(caps: list[Capabilities], short: float) -> str:
    """The `sysctl` per Mac that would let their GPUs wire `short` bytes more in all, leaving macOS
    its reserve on each; "" where they cannot."""
    steps, seen = [], set()
    for c in caps:
        if short <= 0:
            break
        if not c.working_set_gb or c.host in seen:
            continue
        seen.add(c.host)
        top = most_wired_mb(c.memory_gb * GIB)
        more = min(short, top * 2**20 - c.working_set_gb * GIB)
        if more > 0:
            n = min(top, math.ceil((c.working_set_gb * GIB + more) / GIB - 1e-9) * 1024)
            steps.append(f"`sudo sysctl iogpu.wired_limit_mb={n}` on {c.host}")
            short -= more
    return ", ".join(steps) if steps and short <= 0 else ""


def _metal_limit(c: Capabilities, caps: list[Capabilities], short: float) -> str:
    """What to say of a Mac whose rank needs `short` bytes more than it may use: Metal's limit
    and the fix."""
    sharing = sum(1 for x in caps if x.host == c.host)  # ranks on one Mac share its working set
    n = wired_limit_mb(c.working_set_gb * GIB + sharing * short, c.memory_gb * GIB)
    said = (
        f", and Metal lets its GPU wire at most {c.working_set_gb:.1f} GB there (the "
        "recommended working set)"
    )
    if n is None:
        return (
            f"{said}; raising that would leave macOS too little: "
            "add a host or pick a smaller or more quantized model"
        )
    return (
        f"{said}: raise that limit on {c.host} with `sudo sysctl iogpu.wired_limit_mb={n}`, "
        "add a host, or pick a smaller or more quantized model"
    )


def check_fits(model: ModelSpec, caps: list[Capabilities], plan: LayerPlan, kv_tokens: int) -> None:
    """ValueError naming the first rank whose slice needs more memory than it has, and the fix."""
    for r, (c, (s, e)) in enumerate(zip(caps, plan.ranges)):
        need = memory_need(model, c, r, e - s, kv_tokens)
        if need > c.usable_gb * GIB + 1:
            ends = f" + {_gb(model.ends_bytes)} embedding and head" if r == 0 else ""
            fix = (
                _metal_limit(c, caps, need - c.usable_gb * GIB)
                if c.working_set_gb
                else " (set usable_gb in hosts.json if it may use more)"
            )
            raise ValueError(
                f"host {c.host} (rank {r}) cannot hold its slice: layers [{s}, {e}) need "
                f"{_gb(need)} ({e - s} x {_gb(model.layer_bytes)} weights{ends} + "
                f"{_gb((e - s) * layer_kv_bytes(model, kv_tokens))} KV cache for {kv_tokens} "
                f"tokens + {_gb(runtime_bytes(model, c, r, e - s, kv_tokens))} runtime) but it has "
                f"{c.usable_gb:.1f} GB usable of {c.memory_gb:.0f} GB{fix}"
            )
