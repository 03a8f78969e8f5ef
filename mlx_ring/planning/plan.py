"""The layer plan: which contiguous, half-open range of decoder layers each rank holds, and why.

Pure data and pure functions, no MLX: every rank computes the same plan from the same inputs (the
model's sizes, every rank's capabilities, the strategy), so the plan itself never crosses the ring.
Memory is counted in GiB (2**30 bytes, as Apple counts RAM), bandwidth in 10**9 bytes/s.
"""

import heapq
import math
from dataclasses import dataclass

from mlx_ring.gpu import most_wired_mb, wired_limit_mb
from mlx_ring.planning.activations import activation_bytes
from mlx_ring.planning.capabilities import Capabilities

GIB = 2**30
STRATEGIES = ("balanced", "uniform", "memory", "compute", "custom")


@dataclass(frozen=True)
class LayerPlan:
    """`ranges[s] = (start, end)`: stage s runs layers [start, end); together they cover [0, n_layers).
    `tensor` ranks hold each stage, each a 1/`tensor` share of every one of its layers (heads, MLP
    columns, experts), joined by all_sums: rank r is in stage `r // tensor`. A pipeline has
    `tensor == 1` (a stage a rank); tensor mode one stage of every rank."""

    n_layers: int
    ranges: tuple[tuple[int, int], ...]
    strategy: str = "uniform"
    tensor: int = 1

    def __post_init__(self):
        assert self.ranges and self.ranges[0][0] == 0 and self.ranges[-1][1] == self.n_layers, self
        assert all(a[1] == b[0] for a, b in zip(self.ranges, self.ranges[1:])), self
        assert all(s < e for s, e in self.ranges), self
        assert self.tensor >= 1, self

    @property
    def mode(self) -> str:
        return "tensor" if self.tensor > 1 else "pipeline"

    @property
    def size(self) -> int:
        """Ranks in the ring."""
        return len(self.ranges) * self.tensor

    @property
    def sizes(self) -> list[int]:
        """Layers of each stage."""
        return [e - s for s, e in self.ranges]

    def stage_of(self, rank: int) -> int:
        return rank // self.tensor

    def layers_of(self, rank: int) -> range:
        return range(*self.ranges[self.stage_of(rank)])

    def describe(self, hosts: list[str] | None = None) -> str:
        """One line per rank, e.g. `rank 0 (mac-a): layers [0, 15)  15 layers` (in tensor mode
        `... 30 layers, a 1/2 share of each`)."""
        lines = []
        for r in range(self.size):
            s, e = self.ranges[self.stage_of(r)]
            host = f" ({hosts[r]})" if hosts else ""
            share = f", a 1/{self.tensor} share of each" if self.tensor > 1 else ""
            lines.append(f"rank {r}{host}: layers [{s}, {e})  {e - s} layers{share}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know of a model: the size of one layer and of the two ends."""

    n_layers: int
    layer_bytes: float  # parameter bytes of one decoder layer (mean over the layers)
    ends_bytes: float  # embedding + final norm + head (once if tied): rank 0 holds them
    head_read_bytes: float  # bytes the head reads per decoded token (the head, or the tied embedding)
    kv_bytes_per_token: float  # KV cache bytes of one attention layer for one token
    layer_read_bytes: float  # bytes one layer reads per decoded token (MoE: only the active experts)
    layer_flops: float  # FLOPs of one layer per token (2 per active parameter)
    head_flops: float = 0.0
    dtype: str = "float16"
    name: str = ""
    hidden_bytes: float = 0.0  # one token's hidden state as it crosses a hop between ranks
    # The kinds of cache the layers keep (from the caches mlx-lm makes for them): the share that keeps
    # at most a sliding window of `kv_window` tokens, the share that keeps a fixed state of
    # `state_bytes` (a convolution's or an SSM's, one sequence's) instead; the rest keep every token.
    kv_window_share: float = 0.0
    kv_window: int = 0
    state_share: float = 0.0
    state_bytes: float = 0.0
    # The arrays one layer's forward pass makes per token (activations.py counts them), the query heads,
    # the vocabulary, the longest prompt (0: any); and the serving settings they are held for (0: PREFILL_CHUNK auto).
    act_bytes_per_token: float = 0.0
    heads: int = 0
    vocab: int = 0
    context_length: int = 0
    prefill_chunk: int = 0
    max_active: int = 1

    @property
    def total_bytes(self) -> float:
        return self.n_layers * self.layer_bytes + self.ends_bytes


def uniform_plan(n_layers: int, n_ranks: int) -> LayerPlan:
    """Split `n_layers` as evenly as possible; the first `n_layers % n_ranks` ranks get one more."""
    if n_ranks < 1:
        raise ValueError(f"need at least one rank, got {n_ranks}")
    if n_layers < n_ranks:
        raise ValueError(
            f"the model has {n_layers} layers but the hostfile names {n_ranks} ranks; "
            "every rank needs at least one layer: remove hosts or pick a deeper model"
        )
    base, extra = divmod(n_layers, n_ranks)
    return plan_from_sizes(n_layers, [base + (1 if r < extra else 0) for r in range(n_ranks)], "uniform")


def tensor_plan(n_layers: int, n_ranks: int, strategy: str = "uniform") -> LayerPlan:
    """Tensor mode: one stage of all `n_layers`, every rank a 1/`n_ranks` share of each layer."""
    if n_ranks < 1:
        raise ValueError(f"need at least one rank, got {n_ranks}")
    return LayerPlan(n_layers, ((0, n_layers),), strategy, tensor=n_ranks)


def plan_from_sizes(n_layers: int, sizes: list[int], strategy: str = "custom") -> LayerPlan:
    """A plan from explicit per-rank layer counts (e.g. `LAYERS=3,2,2`), checked."""
    if sum(sizes) != n_layers or any(s < 1 for s in sizes):
        raise ValueError(f"layer counts {list(sizes)} must be positive and add up to the model's {n_layers} layers")
    ranges, start = [], 0
    for s in sizes:
        ranges.append((start, start + s))
        start += s
    return LayerPlan(n_layers, tuple(ranges), strategy)


def proportional_sizes(n_layers: int, weights: list[float]) -> list[int]:
    """Layer counts proportional to `weights`, each at least 1 (largest remainder; ties to low ranks)."""
    n = len(weights)
    if n_layers < n:
        uniform_plan(n_layers, n)  # raises the usual message
    total = sum(weights)
    if total <= 0 or any(w < 0 for w in weights):
        weights, total = [1.0] * n, float(n)
    quota = [n_layers * w / total for w in weights]
    sizes = [max(1, math.floor(q)) for q in quota]
    while sum(sizes) > n_layers:  # the minimum of one layer each overshot: take from the most over quota
        r = max((r for r in range(n) if sizes[r] > 1), key=lambda r: (sizes[r] - quota[r], -r))
        sizes[r] -= 1
    while sum(sizes) < n_layers:
        r = max(range(n), key=lambda r: (quota[r] - sizes[r], -r))
        sizes[r] += 1
    return sizes


# --- the cost model ---------------------------------------------------------------------------

def layer_seconds(model: ModelSpec, cap: Capabilities) -> float:
    """Predicted time of one layer for one decoded token: read its weights, or do its math."""
    return max(model.layer_read_bytes / (cap.bandwidth_gbs * 1e9), model.layer_flops / (cap.tflops * 1e12))


def fixed_seconds(model: ModelSpec, cap: Capabilities, rank: int) -> float:
    """Rank 0 also runs the head for every decoded token."""
    if rank != 0:
        return 0.0
    return max(model.head_read_bytes / (cap.bandwidth_gbs * 1e9), model.head_flops / (cap.tflops * 1e12))


def stage_seconds(model: ModelSpec, caps: list[Capabilities], sizes: list[int]) -> list[float]:
    return [fixed_seconds(model, c, r) + n * layer_seconds(model, c) for r, (c, n) in enumerate(zip(caps, sizes))]


def host_seconds(model: ModelSpec, caps: list[Capabilities], sizes: list[int]) -> dict[tuple[str, str], float]:
    """Ranks on one machine take turns on its cores, so a machine is busy for the sum of its stages;
    a rank with a GPU or cores to itself (its `unit`) is busy only for its own."""
    busy: dict[tuple[str, str], float] = {}
    for c, t in zip(caps, stage_seconds(model, caps, sizes)):
        busy[c.host, c.unit] = busy.get((c.host, c.unit), 0.0) + t
    return busy


def bottleneck(model: ModelSpec, caps: list[Capabilities], sizes: list[int]) -> float:
    """The slowest stage (the busiest machine): it bounds decode throughput with the ring kept full."""
    return max(host_seconds(model, caps, sizes).values())


def runtime_bytes(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    """Memory a rank with `n` layers needs beside weights and caches: its activations as estimated
    (`activation_bytes`, the prefill work the scheduler lets it hold at once, against `kv_tokens` keys).
    The warm-up measures them, and what it finds beyond this comes out of the KV room."""
    return activation_bytes(model, cap, rank, n, kv_tokens)


def fixed_bytes(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    return runtime_bytes(model, cap, rank, n, kv_tokens) + (model.ends_bytes if rank == 0 else 0.0)


def layer_kv_bytes(model: ModelSpec, kv_tokens: int) -> float:
    """Cache bytes one layer (the mean over the layers) reserves for `kv_tokens` tokens: all of them in a
    full-attention layer, at most its window in a sliding-window layer, its fixed state in a recurrent one."""
    full = 1.0 - model.kv_window_share - model.state_share
    tokens = full * kv_tokens + model.kv_window_share * min(model.kv_window, kv_tokens)
    return tokens * model.kv_bytes_per_token + model.state_share * model.state_bytes


def per_layer_bytes(model: ModelSpec, kv_tokens: int) -> float:
    return model.layer_bytes + layer_kv_bytes(model, kv_tokens)


def memory_need(model: ModelSpec, cap: Capabilities, rank: int, n: int, kv_tokens: int) -> float:
    """Bytes rank `rank` needs for `n` layers: weights, KV reserve, runtime, and on rank 0 the ends."""
    return fixed_bytes(model, cap, rank, n, kv_tokens) + n * per_layer_bytes(model, kv_tokens)


def kv_room(model: ModelSpec, caps: list[Capabilities], plan: LayerPlan, kv_tokens: int,
                most: int = 1 << 24) -> int:
    """Tokens of KV cache every rank can hold beside its slice (weights, runtime for a context of
    `kv_tokens` and, on rank 0, the ends): the room the ring has for the caches of the requests it
    serves at once. A plan that fits gives at least its KV_TOKENS; `most` caps it (caches that stop
    growing: windows, states)."""
    tokens = most
    for r, (c, (s, e)) in enumerate(zip(caps, plan.ranges)):
        room = c.usable_gb * GIB - fixed_bytes(model, c, r, e - s, kv_tokens) - (e - s) * model.layer_bytes
        lo, hi = 0, tokens
        while lo < hi:  # the most tokens whose caches fit in `room`
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if (e - s) * layer_kv_bytes(model, mid) <= room else (lo, mid - 1)
        tokens = lo
    return tokens


def room_after(model: ModelSpec, kv_room: int, sizes: list[int], excess: list[float]) -> int:
    """`kv_room` (KV tokens every rank has room for, `kv_room()`) once each rank's `excess` bytes come
    out of its share: memory measured in use beyond what the plan counts. Rank r holds the caches of
    `sizes[r]` layers."""
    tokens = kv_room
    for n, x in zip(sizes, excess):
        if x <= 0 or n == 0:
            continue
        left = n * layer_kv_bytes(model, kv_room) - x
        lo, hi = 0, tokens
        while lo < hi:  # the most tokens whose caches fit in what is left of this rank's room
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if n * layer_kv_bytes(model, mid) <= left else (lo, mid - 1)
        tokens = lo
    return tokens


def max_layers(model: ModelSpec, cap: Capabilities, rank: int, kv_tokens: int) -> int:
    """The most layers `cap` holds; its activations grow with its layers where it holds them all."""
    room = cap.usable_gb * GIB - fixed_bytes(model, cap, rank, 0, kv_tokens)
    most = min(model.n_layers, max(0, math.floor(room / per_layer_bytes(model, kv_tokens) + 1e-9)))
    while most and memory_need(model, cap, rank, most, kv_tokens) > cap.usable_gb * GIB + 1:
        most -= 1
    return most


# --- strategies -------------------------------------------------------------------------------

def plan_layers(model: ModelSpec, caps: list[Capabilities], strategy: str = "balanced",
                kv_tokens: int = 8192, sizes: list[int] | None = None) -> LayerPlan:
    """The plan for `strategy`, checked against every rank's memory (ValueError naming the host).

    `sizes` (from LAYERS=) fixes the counts whatever the strategy, as `custom` with explicit counts.
    """
    n, L = len(caps), model.n_layers
    if strategy not in STRATEGIES:
        raise ValueError(f"STRATEGY={strategy!r} is not known; use one of {', '.join(STRATEGIES)}")
    for c in caps:
        if min(c.usable_gb, c.tflops, c.bandwidth_gbs) <= 0:
            raise ValueError(f"host {c.host}: capabilities must be positive, got usable {c.usable_gb} GB, "
                             f"{c.tflops} TFLOP/s, {c.bandwidth_gbs} GB/s; fix its keys in hosts.json")
    if sizes is not None:
        if len(sizes) != n:
            raise ValueError(f"LAYERS names {len(sizes)} ranks but the ring has {n}; give one count per host")
        plan = plan_from_sizes(L, list(sizes), "custom")
    elif strategy == "uniform":
        plan = uniform_plan(L, n)
    elif strategy == "memory":
        room = [max(0.0, c.usable_gb * GIB - fixed_bytes(model, c, r, 0, kv_tokens)) for r, c in enumerate(caps)]
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
            hint = "no split fits: add a host, pick a smaller or more quantized model, or lower KV_TOKENS"
        raise ValueError(f"{e}; {hint}") from None
    return plan


def custom_sizes(n_layers: int, caps: list[Capabilities]) -> list[int]:
    """Hosts with `layers` get exactly that many; the rest share what is left by `weight` (default 1)."""
    fixed = sum(c.layers for c in caps if c.layers is not None)
    free = [r for r, c in enumerate(caps) if c.layers is None]
    left = n_layers - fixed
    if (not free and left != 0) or (free and left < len(free)) or any(c.layers is not None and c.layers < 1 for c in caps):
        raise ValueError(f"the `layers` keys in hosts.json give {fixed} of the model's {n_layers} layers to "
                         f"{len(caps) - len(free)} hosts, leaving {left} for {len(free)} others; "
                         "make them add up (every host needs at least one layer)")
    shares = proportional_sizes(left, [caps[r].weight if caps[r].weight is not None else 1.0 for r in free]) if free else []
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


def _does_not_fit(model: ModelSpec, caps: list[Capabilities], cap: list[int], kv_tokens: int) -> str:
    each = "; ".join(f"{c.host} (rank {r}) holds at most {cap[r]} in {c.usable_gb:.1f} GB usable"
                     + (f" (its GPU may wire {c.working_set_gb:.1f} of {c.memory_gb:.0f} GB)"
                        if c.working_set_gb else "") for r, c in enumerate(caps))
    need = memory_need(model, caps[0], 0, model.n_layers, kv_tokens) + sum(
        runtime_bytes(model, c, r, 0, kv_tokens) for r, c in enumerate(caps) if r)
    have = sum(c.usable_gb for c in caps) * GIB
    raise_limits = _raise_metal_limits(caps, need - have + per_layer_bytes(model, kv_tokens))
    return (f"the model does not fit: its {model.n_layers} layers of {_gb(model.layer_bytes)} (+ {_gb(model.ends_bytes)} "
            f"embedding and head on rank 0, KV cache for {kv_tokens} tokens) need {_gb(need)} in all, the hosts have "
            f"{_gb(have)}: {each}. Add a host, pick a smaller or more quantized model, or lower KV_TOKENS"
            + (f"; or let the Macs' GPUs wire more than Metal's recommended working set: {raise_limits}"
               if raise_limits else ""))


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
    """What to say of a Mac whose rank needs `short` bytes more than it may use: Metal's limit and the fix."""
    sharing = sum(1 for x in caps if x.host == c.host)  # ranks on one Mac share its working set
    n = wired_limit_mb(c.working_set_gb * GIB + sharing * short, c.memory_gb * GIB)
    said = f", and Metal lets its GPU wire at most {c.working_set_gb:.1f} GB there (the recommended working set)"
    if n is None:
        return (f"{said}; raising that would leave macOS too little: "
                "add a host or pick a smaller or more quantized model")
    return (f"{said}: raise that limit on {c.host} with `sudo sysctl iogpu.wired_limit_mb={n}`, "
            "add a host, or pick a smaller or more quantized model")


def check_fits(model: ModelSpec, caps: list[Capabilities], plan: LayerPlan, kv_tokens: int) -> None:
    """ValueError naming the first rank whose slice needs more memory than it has, and the fix."""
    for r, (c, (s, e)) in enumerate(zip(caps, plan.ranges)):
        need = memory_need(model, c, r, e - s, kv_tokens)
        if need > c.usable_gb * GIB + 1:
            ends = f" + {_gb(model.ends_bytes)} embedding and head" if r == 0 else ""
            fix = (_metal_limit(c, caps, need - c.usable_gb * GIB) if c.working_set_gb
                   else " (set usable_gb in hosts.json if it may use more)")
            raise ValueError(
                f"host {c.host} (rank {r}) cannot hold its slice: layers [{s}, {e}) need {_gb(need)} "
                f"({e - s} x {_gb(model.layer_bytes)} weights{ends} + {_gb((e - s) * layer_kv_bytes(model, kv_tokens))} "
                f"KV cache for {kv_tokens} tokens + {_gb(runtime_bytes(model, c, r, e - s, kv_tokens))} runtime) but it "
                f"has {c.usable_gb:.1f} GB usable of {c.memory_gb:.0f} GB{fix}")


def hop_seconds(model: ModelSpec, links: list[tuple[float, float]], tokens: int = 1) -> float:
    """Time one step of `tokens` tokens spends between ranks: on each hop (rtt ms, Gbit/s), the hidden
    states' bytes over the link's bandwidth plus half its round trip."""
    return sum(tokens * model.hidden_bytes * 8 / (gbit * 1e9) + rtt_ms / 2e3 for rtt_ms, gbit in links)
