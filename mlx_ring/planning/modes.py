"""What each way of splitting the model is predicted to do on a ring: decoded tokens/s for one
stream and in aggregate, the first token of a long prompt, and whether it fits. Pure, no MLX.

Pipeline: a rank holds a range of layers; a token passes every stage in turn and the hops between
them (cost.py's stage times). Tensor: every rank holds its share of every layer and reads and
computes that share, and two all_sums a layer (after attention and after the MLP) of every row's
hidden state join the ranks: each costs the link's latency plus its bytes over the link's bandwidth.
The ranks wait for each other at every all_sum, so the slowest rank's share bounds each layer; rank
0 also runs the head; every rank holds the embedding.
"""

import math
from dataclasses import dataclass

from mlx_ring.planning.activations import holds_graph, metal
from mlx_ring.planning.capabilities import Capabilities, compute_units
from mlx_ring.planning.cost import hop_seconds, layer_kv_bytes, runtime_bytes
from mlx_ring.planning.plan import GIB, LayerPlan, ModelSpec
from mlx_ring.planning.split import ShareSize

STREAMS = (1, 16, 64)  # the loads each mode is predicted at
PROMPT = 1536  # tokens of the long prompt whose first token is predicted
CHUNK = 512  # prompt tokens a prefill step takes where PREFILL_CHUNK is auto
# A tensor rank's host work per layer and step. On a GPU whose steps come on the control link
# (ring/control.py), every rank builds a step while its device runs the last one,
# as mlx-lm's own loop does: the host's whole work (Python and MLX's encoding) hides behind the
# device's, or the device's behind it; rank 0's thread was as busy as mlx-lm's loop's
# (`tools/bench_tensor.py --split`, figures in docs/benchmarks.md).
GPU_BUSY_LAYER_S = 0.31e-3
# Where the headers came through MLX (JACCL's framed steps, as measured; JACCL with the control
# link is not measured yet, so predicted the same), a worker builds a step only once its
# header comes, and its device starts the step after that, so the host's work is added to the step
# (`tools/bench_tensor.py --trace`, figures in docs/benchmarks.md). On a
# CPU device, where the graph's building shares the cores with its compute, always added: calibrated
# on this project's 2-core CI machine, a core per rank (tensor-2's measured step,
# tests/unit/planning/test_probe_figures.py). Macs: not measured; the GPU's figures.
GPU_HOST_LAYER_S = 0.12e-3
CPU_HOST_LAYER_S = 0.22e-3


@dataclass(frozen=True)
class AllSum:
    """What one all_sum costs over a ring's links: `latency_ms` for a small array plus its
    bytes at `gbytes_s` (10**9 bytes/s), as measured on a ring of `ranks` (a default: 2,
    scaled to the ring)."""

    latency_ms: float
    gbytes_s: float
    ranks: int = 2
    transport: str = "ring (TCP)"
    source: str = "default"

    def seconds(self, nbytes: float, n: int) -> float:
        """One all_sum of `nbytes` on `n` ranks. A ring all-reduce takes (n-1) steps each
        way and moves 2(n-1)/n of the array through every link: scaled from the `ranks`
        it was measured on."""
        if n < 2:
            return 0.0
        m = max(2, self.ranks)
        steps, moved = (n - 1) / (m - 1), (2 * (n - 1) / n) / (2 * (m - 1) / m)
        return self.latency_ms / 1e3 * steps + nbytes * moved / (self.gbytes_s * 1e9)


# Defaults where nothing was measured on this ring, from recorded measurements (2 ranks each;
# all_sums chained in one graph as the probe times them; docs/benchmarks.md has the runs).
DEFAULT_ALLSUM = {
    # MLX's ring backend goes through the host; links between machines add their own round trip.
    "ring": AllSum(
        0.5,
        0.6,
        2,
        "ring (TCP)",
        "default for MLX's ring backend over TCP (0.3-1 ms an all_sum seen)",
    ),
    # JACCL (RDMA over Thunderbolt 5): its published latency a message; Thunderbolt 5's 80 Gbit/s.
    "jaccl": AllSum(
        0.03, 6.0, 2, "JACCL (Thunderbolt)", "default for JACCL (about 30 us a message)"
    ),
    # NCCL over NVLink, as measured on 2 x H100.
    "nccl": AllSum(
        0.047, 75.0, 2, "NCCL", "default for NCCL (0.047 ms for (1, 4096) bf16 on 2 x H100)"
    ),
}


def _device_seconds(read_bytes: float, flops: float, cap: Capabilities) -> float:
    """A device reads `read_bytes` or does `flops`, whichever takes longer."""
    return max(read_bytes / (cap.bandwidth_gbs * 1e9), flops / (cap.tflops * 1e12))


def _head_seconds(model: ModelSpec, cap: Capabilities, rows: int) -> float:
    return _device_seconds(model.head_read_bytes, rows * model.head_flops, cap)


def embed_bytes(model: ModelSpec) -> float:
    """What every rank of a tensor ring holds of the ends: the embedding (the
    head too where tied)."""
    untied = model.ends_bytes - model.head_read_bytes
    return untied if untied >= model.head_read_bytes / 2 else model.ends_bytes


# --- pipeline -----------------------------------------------------------------------------------


def pipeline_stages(
    model: ModelSpec, caps: list[Capabilities], plan: LayerPlan, rows: int
) -> list[float]:
    """Each stage's time for a step of `rows` rows (one token each)."""
    out = []
    for r, (c, n) in enumerate(zip(caps, plan.sizes)):
        head = _head_seconds(model, c, rows) if r == 0 else 0.0
        out.append(head + n * _device_seconds(model.layer_read_bytes, rows * model.layer_flops, c))
    return out


def _busiest(caps: list[Capabilities], stages: list[float]) -> float:
    """Ranks sharing a device take turns on it: the busiest device bounds a ring kept full."""
    busy: dict[tuple[str, str], float] = {}
    for c, t in zip(caps, stages):
        busy[c.host, c.unit] = busy.get((c.host, c.unit), 0.0) + t
    return max(busy.values())


def pipeline_tokens_per_s(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    streams: int,
    links: list[tuple[float, float]] | None = None,
) -> float:
    """Decoded tokens/s of `streams` streams: one decode group per device in flight (GROUPS
    auto), so a trip round the ring takes the longer of one group's pass through every stage and
    hop, and the busiest device's work on every group."""
    groups = min(streams, compute_units(caps))
    rows = math.ceil(streams / groups)
    stages = pipeline_stages(model, caps, plan, rows)
    trip = max(sum(stages) + hop_seconds(model, links or [], rows), groups * _busiest(caps, stages))
    return streams / trip


def pipeline_first_token(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    prompt: int = PROMPT,
    links: list[tuple[float, float]] | None = None,
) -> float:
    """Seconds to the first token of a `prompt`-token prompt: its chunks follow each
    other through the stages, so after the first chunk's whole pass each next one adds
    the busiest device's share."""
    chunk = min(prompt, model.prefill_chunk or CHUNK)
    k = math.ceil(prompt / chunk)
    stages = [
        n * _device_seconds(model.layer_read_bytes, chunk * model.layer_flops, c)
        for c, n in zip(caps, plan.sizes)
    ]
    first = sum(stages) + hop_seconds(model, links or [], chunk)
    return first + (k - 1) * _busiest(caps, stages) + _head_seconds(model, caps[0], 1)


# --- tensor -------------------------------------------------------------------------------------


def _turns(caps: list[Capabilities]) -> list[int]:
    """How many ranks take turns on each rank's device."""
    count: dict[tuple[str, str], int] = {}
    for c in caps:
        count[c.host, c.unit] = count.get((c.host, c.unit), 0) + 1
    return [count[c.host, c.unit] for c in caps]


def tensor_parts(
    model: ModelSpec, caps: list[Capabilities], shares: list[ShareSize], rows: int, allsum: AllSum
) -> dict:
    """A tensor step of `rows` rows, in seconds: `compute` (every layer's share on its slowest
    rank, ranks sharing a device doing theirs in turn), `head` (rank 0), `allsum` (two a layer),
    `host` (the host's work on the step that the device's does not hide, `hides_host`). They add
    up to the step."""
    n = len(caps)
    layer = max(
        k * _device_seconds(s.layer * model.layer_read_bytes, s.layer * rows * model.layer_flops, c)
        for c, s, k in zip(caps, shares, _turns(caps))
    )
    parts = {
        "compute": model.n_layers * layer,
        "head": _head_seconds(model, caps[0], rows),
        "allsum": 2 * model.n_layers * allsum.seconds(rows * model.hidden_bytes, n),
    }
    if hides_host(caps, allsum):
        return parts | {"host": max(0.0, model.n_layers * GPU_BUSY_LAYER_S - sum(parts.values()))}
    return parts | {"host": model.n_layers * max(map(host_layer_seconds, caps))}


def hides_host(caps: list[Capabilities], allsum: AllSum) -> bool:
    """Whether every rank builds a step while its device runs the last: GPUs on any ring but
    JACCL's (measured so only elsewhere)."""
    return allsum.transport != DEFAULT_ALLSUM["jaccl"].transport and all(
        holds_graph(c) or metal(c) for c in caps
    )


def host_layer_seconds(cap: Capabilities) -> float:
    """A tensor rank's host work per layer and step that its step does not hide,
    where it hides none."""
    return GPU_HOST_LAYER_S if holds_graph(cap) or metal(cap) else CPU_HOST_LAYER_S


def tensor_tokens_per_s(
    model: ModelSpec,
    caps: list[Capabilities],
    shares: list[ShareSize],
    streams: int,
    allsum: AllSum,
) -> float:
    """Decoded tokens/s of `streams` streams, all in one step."""
    return streams / sum(tensor_parts(model, caps, shares, streams, allsum).values())


def tensor_first_token(
    model: ModelSpec,
    caps: list[Capabilities],
    shares: list[ShareSize],
    allsum: AllSum,
    prompt: int = PROMPT,
) -> float:
    """Seconds to the first token of a `prompt`-token prompt, its chunks one after the other."""
    chunk = min(prompt, model.prefill_chunk or CHUNK)
    full, last = divmod(prompt, chunk)
    t = sum(
        (lambda p: p["compute"] + p["allsum"])(tensor_parts(model, caps, shares, rows, allsum))
        for rows in [chunk] * full + ([last] if last else [])
    )
    return t + _head_seconds(model, caps[0], 1)


def tensor_need(
    model: ModelSpec, cap: Capabilities, rank: int, share: ShareSize, kv_tokens: int
) -> float:
    """Bytes a rank of a tensor ring needs: its part of every layer and of their KV cache, the
    embedding (rank 0: both ends) and the runtime of a rank running every layer."""
    ends = model.ends_bytes if rank == 0 else embed_bytes(model)
    layers = model.n_layers * (
        share.layer * model.layer_bytes + share.cache * layer_kv_bytes(model, kv_tokens)
    )
    return ends + layers + runtime_bytes(model, cap, rank, model.n_layers, kv_tokens)


def tensor_misfit(
    model: ModelSpec, caps: list[Capabilities], shares: list[ShareSize], kv_tokens: int
) -> str:
    """ "" where every rank holds its share, else a sentence naming the first rank that cannot."""
    for r, (c, s) in enumerate(zip(caps, shares)):
        need = tensor_need(model, c, r, s, kv_tokens)
        if need > c.usable_gb * GIB + 1:
            return (
                f"tensor mode needs {need / GIB:.1f} GB on {c.host} (rank {r}: a {s.layer:.0%} "
                f"share of every layer, its KV cache for {kv_tokens} tokens, "
                f"{'both ends' if r == 0 else 'the embedding'} and the runtime) but it has "
                f"{c.usable_gb:.1f} GB usable"
            )
    return ""


def tensor_kv_room(
    model: ModelSpec,
    caps: list[Capabilities],
    shares: list[ShareSize],
    kv_tokens: int,
    most: int = 1 << 24,
) -> int:
    """Tokens of KV cache every rank of a tensor ring has room for beside its
    share of the weights."""
    tokens = most
    for r, (c, s) in enumerate(zip(caps, shares)):
        room = (
            c.usable_gb * GIB
            - tensor_need(model, c, r, s, 0)
            + runtime_bytes(model, c, r, model.n_layers, 0)
            - runtime_bytes(model, c, r, model.n_layers, kv_tokens)
        )
        lo, hi = 0, tokens
        while lo < hi:  # the most tokens whose caches fit in `room`
            mid = (lo + hi + 1) // 2
            lo, hi = (
                (mid, hi)
                if model.n_layers * s.cache * layer_kv_bytes(model, mid) <= room
                else (lo, mid - 1)
            )
        tokens = lo
    return tokens
