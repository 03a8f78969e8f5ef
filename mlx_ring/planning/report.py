"""The layer plan as plain data and as a table: what each rank holds, needs and is predicted to take
(for logs, `launch.sh plan`, `./launch.sh check` and /cluster/status). Pure, no MLX."""

from mlx_ring.planning.auto import format_modes
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import (
    bottleneck,
    hop_seconds,
    kv_room,
    layer_kv_bytes,
    memory_need,
    runtime_bytes,
    stage_seconds,
)
from mlx_ring.planning.modes import (
    DEFAULT_ALLSUM,
    AllSum,
    embed_bytes,
    tensor_kv_room,
    tensor_need,
    tensor_parts,
)
from mlx_ring.planning.plan import GIB, LayerPlan, ModelSpec
from mlx_ring.planning.promptcache import (
    Blocks,
    buffers,
    format_cache,
    rank_figures,
    rank_parts,
    ring_figures,
)
from mlx_ring.planning.split import ShareSize, even_sizes


def summary(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    kv_tokens: int,
    links: list[tuple[float, float]] | None = None,
    shares: list[ShareSize] | None = None,
    allsum: AllSum | None = None,
    kept: list[float] | None = None,
    blocks: Blocks | None = None,
    ram_cap_gb: float | None = None,
) -> dict:
    """The plan with its predictions, as plain data (for logs, `launch.sh plan --json`,
    /cluster/status). `links`: each hop's measured (round trip ms, Gbit/s), from `./launch.sh
    check`; else hops count 0. A tensor plan's ranks each hold `shares` of every layer (equal
    where None), joined by `allsum`. `kept`: the GB of each rank's RAM tier (`plan_for`'s),
    counted in its memory figure; with `blocks` (how they are kept) also the tokens they hold,
    the disk tier's buffers, and the ring's `prompt_cache` (PROMPT_CACHE_GB: `ram_cap_gb`)."""
    if plan.tensor > 1:
        out = tensor_summary(
            model,
            caps,
            plan,
            kv_tokens,
            shares or even_sizes(plan.size),
            allsum or DEFAULT_ALLSUM["ring"],
            kept,
            blocks,
        )
        return with_cache(out, model, plan, shares, kept, blocks, ram_cap_gb)
    stages = stage_seconds(model, caps, plan.sizes)
    ranks = []
    for r, (c, (s, e), t) in enumerate(zip(caps, plan.ranges, stages)):
        ranks.append(
            {
                **rank_row(r, c),
                "layers": [s, e],
                "working_set_gb": round(c.working_set_gb, 2),
                "weights_gb": round(
                    ((e - s) * model.layer_bytes + (model.ends_bytes if r == 0 else 0)) / GIB, 3
                ),
                "needs_gb": round(memory_need(model, c, r, e - s, kv_tokens) / GIB, 3),
                "runtime_gb": round(runtime_bytes(model, c, r, e - s, kv_tokens) / GIB, 3),
                "predicted_stage_ms": round(t * 1e3, 3),
            }
        )
    with_kept(model, caps, plan, None, kv_tokens, ranks, kept, blocks)
    room = kv_room(model, caps, plan, kv_tokens)
    memory_figures(model, ranks, room)
    hops = hop_seconds(model, links or [])
    one_stream = sum(stages) + hops
    out = {
        "strategy": plan.strategy,
        "mode": plan.mode,
        "n_layers": plan.n_layers,
        "kv_tokens": kv_tokens,
        "kv_capacity_tokens": room,
        "ranks": ranks,
        "predicted_tokens_per_s": round(1 / one_stream, 2) if one_stream > 0 else None,
        "slowest_stage_ms": round(bottleneck(model, caps, plan.sizes) * 1e3, 3),
        "hops_ms": round(hops * 1e3, 3) if links else None,
    }
    return with_cache(out, model, plan, shares, kept, blocks, ram_cap_gb)


def with_cache(
    s: dict,
    model: ModelSpec,
    plan: LayerPlan,
    shares: list[ShareSize] | None,
    kept: list[float] | None,
    blocks: Blocks | None,
    ram_cap_gb: float | None,
) -> dict:
    """A summary with the ring's prompt cache (`promptcache.ring_figures`), where it is known."""
    if kept is None or blocks is None:
        return s
    return {**s, "prompt_cache": ring_figures(model, plan, shares, kept, ram_cap_gb, blocks)}


def rank_row(rank: int, c: Capabilities) -> dict:
    """A rank's row of a summary as far as its measured capabilities go, in either mode."""
    return {
        "rank": rank,
        "host": c.host,
        "device": c.device,
        "memory_gb": round(c.memory_gb, 2),
        "usable_gb": round(c.usable_gb, 2),
        "tflops": round(c.tflops, 3),
        "bandwidth_gbs": round(c.bandwidth_gbs, 1),
        "capabilities_from": c.source,
    }


def tensor_summary(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    kv_tokens: int,
    shares: list[ShareSize],
    allsum: AllSum,
    kept: list[float] | None = None,
    blocks: Blocks | None = None,
) -> dict:
    """`summary` of a tensor plan: every rank its share of every layer; a step is the slowest
    share of each layer, rank 0's head and two all_sums a layer."""
    parts = tensor_parts(model, caps, shares, 1, allsum)
    ranks = []
    for r, (c, s) in enumerate(zip(caps, shares)):
        own = tensor_parts(model, [c], [s], 1, allsum)["compute"] + (
            parts["head"] if r == 0 else 0.0
        )
        ranks.append(
            {
                **rank_row(r, c),
                "layers": [0, plan.n_layers],
                "share": round(s.layer, 4),
                "cache_share": round(s.cache, 4),
                "working_set_gb": round(c.working_set_gb, 2),
                "weights_gb": round(
                    (
                        plan.n_layers * s.layer * model.layer_bytes
                        + (model.ends_bytes if r == 0 else embed_bytes(model))
                    )
                    / GIB,
                    3,
                ),
                "needs_gb": round(tensor_need(model, c, r, s, kv_tokens) / GIB, 3),
                "runtime_gb": round(runtime_bytes(model, c, r, plan.n_layers, kv_tokens) / GIB, 3),
                "predicted_stage_ms": round(own * 1e3, 3),
            }
        )
    with_kept(model, caps, plan, shares, kv_tokens, ranks, kept, blocks)
    room = tensor_kv_room(model, caps, shares, kv_tokens)
    memory_figures(model, ranks, room)
    step = sum(parts.values())
    return {
        "strategy": plan.strategy,
        "mode": plan.mode,
        "n_layers": plan.n_layers,
        "kv_tokens": kv_tokens,
        "kv_capacity_tokens": room,
        "ranks": ranks,
        "predicted_tokens_per_s": round(1 / step, 2),
        "slowest_stage_ms": round(step * 1e3, 3),
        "allsum_ms_per_token": round(parts["allsum"] * 1e3, 3),
        "hops_ms": None,
    }


def memory_figures(model: ModelSpec, ranks: list[dict], room: int) -> None:
    """Each rank's memory figure for a KV room of `room` tokens (what every rank grants the
    caches at once): `kv_room_gb`, its layers' caches for that room (a tensor rank's
    `cache_share` of every layer's), and `most_gb`, the most it holds: its weights, runtime, KV
    room and prompt cache (`weights_gb`, `runtime_gb`, `prompt_cache_gb` and the disk tier's
    `disk_queue_gb` and `restore_gb`)."""
    for r in ranks:
        lo, hi = r["layers"]
        r["kv_room_gb"] = kv_room_gb(model, hi - lo, r.get("cache_share"), room)
        r["most_gb"] = most_gb(
            r["weights_gb"],
            r["runtime_gb"],
            r["kv_room_gb"],
            r.get("prompt_cache_gb"),
            (r.get("disk_queue_gb") or 0.0) + (r.get("restore_gb") or 0.0),
        )


def kv_room_gb(model: ModelSpec, layers: int, share: float | None, room: int) -> float:
    """GB of KV cache a rank of `layers` layers (a tensor rank: its `share` of each one's cache)
    grants `room` tokens."""
    return round(layers * (share or 1.0) * layer_kv_bytes(model, room) / GIB, 3)


def most_gb(
    weights: float,
    runtime: float,
    kv_room: float,
    prompt_cache: float | None,
    disk_buffers: float = 0.0,
) -> float:
    """The most a rank holds (GB): its weights, runtime, KV room, RAM tier and the disk tier's
    write queue and restore staging."""
    return round(weights + runtime + kv_room + (prompt_cache or 0.0) + disk_buffers, 3)


def with_kept(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    shares: list[ShareSize] | None,
    kv_tokens: int,
    ranks: list[dict],
    kept: list[float] | None,
    blocks: Blocks | None,
) -> None:
    """Each rank's prompt cache: `prompt_cache_gb`, the GB `kept` sets aside for its RAM tier, and
    with `blocks` the rest of `promptcache.rank_figures`; its `usable_gb` is again what it may
    fill, the prompt cache's memory included (`caps` are less it)."""
    for r, c, k, (n, share) in zip(ranks, caps, kept or [], rank_parts(plan, shares)):
        figures = (
            {"prompt_cache_gb": round(k, 3)}
            if blocks is None
            else rank_figures(model, n, share, kv_tokens, blocks, k)
        )
        held = sum(buffers(model, n, share, kv_tokens, blocks)) / GIB if blocks else 0.0
        r |= figures | {"usable_gb": round(c.usable_gb + k + held, 2)}


def format_summary(s: dict) -> str:
    """A table of `summary(...)`: one line per rank, then the prediction."""
    hw = max(4, *(len(r["host"]) for r in s["ranks"])) + 2
    dw = max((len(r["device"]) for r in s["ranks"]), default=0)
    dw = dw + 2 if dw else 0
    lines = [
        f"{'rank':<5}{'host':<{hw}}{'device' if dw else '':<{dw}}{'memory':>6}{'usable':>9}"
        f"{'TFLOP/s':>9}{'GB/s':>6}  {'layers':<14}{'weights':>9}{'runtime':>9}{'needs':>9}"
        f"{'KV room':>9}{'at most':>9}{'stage':>10}"
    ]
    for r in s["ranks"]:
        lo, hi = r["layers"]
        lines.append(
            f"{r['rank']:<5}{r['host']:<{hw}}{r['device']:<{dw}}{r['memory_gb']:>3.0f} "
            f"GB{r['usable_gb']:>6.1f} GB{r['tflops']:>9.2f}{r['bandwidth_gbs']:>6.0f}  "
            f"{f'[{lo}, {hi})':<10}{hi - lo:>3} {r['weights_gb']:>6.1f} "
            f"GB{r.get('runtime_gb', 0):>6.2f} GB{r['needs_gb']:>6.1f} "
            f"GB{r.get('kv_room_gb', 0):>6.1f} GB{r.get('most_gb', 0):>6.1f} "
            f"GB{r['predicted_stage_ms']:>7.1f} ms"
        )
    lines += format_cache(s)
    if s.get("mode") == "tensor":
        lines.append(
            f"predicted decode: {s['predicted_tokens_per_s']} tokens/s for one stream, every rank "
            f"a share of every layer: a step {s['slowest_stage_ms']:.1f} ms, of which all_sums "
            f"{s['allsum_ms_per_token']:.1f} ms"
        )
    else:
        lines.append(
            f"predicted decode: {s['predicted_tokens_per_s']} tokens/s for one stream; with the "
            f"ring kept full, {1e3 / s['slowest_stage_ms']:.1f} steps/s (slowest stage "
            f"{s['slowest_stage_ms']:.1f} ms); "
            + (
                "network hops not counted (`./launch.sh check` measures them)"
                if s.get("hops_ms") is None
                else f"network hops {s['hops_ms']:.3f} ms per token, as measured"
            )
        )
    if s.get("modes"):
        lines.append(format_modes(s["modes"], s["mode_reason"]))
    return "\n".join(lines)
