"""The prompt cache as the layer plan counts it, rank by rank. Pure, no MLX.

The split is made without it, so the cache never takes a layer's place. Out of what the split
leaves a rank beyond its weights, runtime and KV reserve for KV_TOKENS come first its disk tier's
buffers, memory like the rest (GPU memory on a Mac): the write queue (`WRITE_QUEUE_BYTES` at most)
and the restore staging, the blocks a FETCH reads back from disk and holds until their LOAD
(counted for a prompt of KV_TOKENS tokens). Then the RAM tier: `RAM_SHARE` of what is left, at
most PROMPT_CACHE_GB; the rest stays KV room for the requests served at once. Rank 0's index
counts the RAM tier in tokens (cache/blocks.py) and a block counts only where every rank holds
it, so the rank that holds the fewest tokens in its GB binds.
"""

import math
from dataclasses import dataclass, replace

from mlx_ring.cache_sizes import WRITE_QUEUE_BYTES
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import memory_need
from mlx_ring.planning.modes import tensor_need
from mlx_ring.planning.plan import GIB, LayerPlan, ModelSpec
from mlx_ring.planning.split import ShareSize, even_sizes

# the RAM tier's share of what a rank has left: the other half is KV room beyond KV_TOKENS, so
# long prompts and bursts still fit beside a full cache
RAM_SHARE = 0.5
BLOCK = 256  # PROMPT_CACHE_BLOCK's default


@dataclass(frozen=True)
class Blocks:
    """How every rank keeps the prompt cache's blocks, as far as their sizes go."""

    disk: bool = False  # each rank has a disk tier (PROMPT_DISK_GB is not 0)
    kv_share: float = 1.0  # a block's bytes per byte of the KV it keeps (KV_BITS: fewer)
    block: int = BLOCK  # PROMPT_CACHE_BLOCK: tokens a block holds


PLAIN = Blocks()  # RAM only, each block as the KV cache holds it


def token_bytes(model: ModelSpec, layers: int, share: float | None, blocks: Blocks) -> float:
    """Bytes a rank's blocks take per token: its `layers` layers' KV (a tensor rank: its `share`
    of each one's) at `blocks.kv_share`, and each block's fixed states (a convolution's, an SSM's)
    spread over its tokens."""
    states = model.state_share * model.state_bytes / blocks.block
    return layers * (share or 1.0) * (model.kv_bytes_per_token * blocks.kv_share + states)


def buffers(
    model: ModelSpec, layers: int, share: float | None, kv_tokens: int, blocks: Blocks
) -> tuple[float, float]:
    """(write queue, restore staging) in bytes on a rank of `layers` layers; none without a disk
    tier."""
    if not blocks.disk:
        return 0.0, 0.0
    return float(WRITE_QUEUE_BYTES), kv_tokens * token_bytes(model, layers, share, blocks)


def rank_parts(plan: LayerPlan, shares: list[ShareSize] | None) -> list[tuple[int, float | None]]:
    """Each rank's (layers, share of each layer's cache) in `plan`."""
    if plan.tensor == 1:
        return [(e - s, None) for s, e in plan.ranges]
    return [(plan.n_layers, s.cache) for s in shares or even_sizes(plan.size)]


def set_aside(
    model: ModelSpec,
    caps: list[Capabilities],
    plan: LayerPlan,
    kv_tokens: int,
    cap_gb: float | None,
    blocks: Blocks = PLAIN,
    shares: list[ShareSize] | None = None,
) -> tuple[list[Capabilities], list[float]]:
    """(each rank's capabilities less what its prompt cache keeps, the GB of its RAM tier) for
    `plan` (a tensor plan: each rank's `shares`). `cap_gb`: PROMPT_CACHE_GB, the most a RAM tier
    takes (None: no more than its share; 0: none)."""
    out, kept = [], []
    for r, (c, (layers, share)) in enumerate(zip(caps, rank_parts(plan, shares))):
        need = (
            memory_need(model, c, r, layers, kv_tokens)
            if plan.tensor == 1
            else tensor_need(model, c, r, (shares or even_sizes(plan.size))[r], kv_tokens)
        )
        held = sum(buffers(model, layers, share, kv_tokens, blocks))
        left = max(0.0, c.usable_gb * GIB - need - held)
        most = math.inf if cap_gb is None else cap_gb * GIB
        ram = min(RAM_SHARE * left, most)
        kept.append(ram / GIB)
        out.append(replace(c, usable_gb=max(0.0, c.usable_gb - (held + ram) / GIB)))
    return out, kept


def rank_figures(
    model: ModelSpec,
    layers: int,
    share: float | None,
    kv_tokens: int,
    blocks: Blocks,
    ram_gb: float,
) -> dict:
    """A rank's prompt cache for its row of the plan's summary: its RAM tier's GB and the tokens
    they hold (`prompt_cache_gb`, `prompt_cache_tokens`) and, with a disk tier, its write queue
    and restore staging (`disk_queue_gb`, `restore_gb`)."""
    per_token = token_bytes(model, layers, share, blocks)
    out = {
        "prompt_cache_gb": round(ram_gb, 3),
        "prompt_cache_tokens": int(ram_gb * GIB / per_token) if per_token > 0 else 0,
    }
    if blocks.disk:
        queue, staging = buffers(model, layers, share, kv_tokens, blocks)
        out |= {"disk_queue_gb": round(queue / GIB, 3), "restore_gb": round(staging / GIB, 3)}
    return out


def ring_figures(
    model: ModelSpec,
    plan: LayerPlan,
    shares: list[ShareSize] | None,
    kept: list[float],
    cap_gb: float | None,
    blocks: Blocks,
) -> dict:
    """The prompt cache of the whole ring for the plan's summary: `ram_tokens`, the tokens rank 0's
    index may hold (the fewest any rank's RAM tier holds), `ram_cap_gb` (PROMPT_CACHE_GB; None:
    auto), `disk`, and `token_bytes`, what a token's blocks take on the rank they take most of (a
    disk cap of the same GB on every rank holds as many tokens as that rank's)."""
    per_token = [token_bytes(model, n, s, blocks) for n, s in rank_parts(plan, shares)]
    return {
        "ram_tokens": min(
            (int(k * GIB / b) if b > 0 else 0 for k, b in zip(kept, per_token)), default=0
        ),
        "ram_cap_gb": cap_gb,
        "disk": blocks.disk,
        "token_bytes": max(per_token, default=0.0),
    }


def format_cache(s: dict) -> list[str]:
    """Lines of a summary's prompt cache: each rank's RAM tier (GB and tokens) and, with a disk
    tier, its write queue and restore staging; then the ring's RAM tier in tokens. Nothing where the
    summary has no prompt cache (PROMPT_CACHE_GB and PROMPT_DISK_GB both 0)."""
    ranks = [r for r in s["ranks"] if "prompt_cache_gb" in r]
    if not ranks or not (any(r["prompt_cache_gb"] for r in ranks) or "restore_gb" in ranks[0]):
        return []
    disk = "restore_gb" in ranks[0]
    lines = [
        f"{'prompt cache':<14}"
        + (f"{'RAM tier':<27}{'write queue':>13}{'restore staging':>17}" if disk else "RAM tier")
    ]
    for r in ranks:
        lines.append(
            f"{'rank ' + str(r['rank']):<14}{r['prompt_cache_gb']:>6.2f} GB "
            f"{r.get('prompt_cache_tokens', 0):>10,} tokens"
            + (f"{r['disk_queue_gb']:>10.2f} GB{r['restore_gb']:>14.2f} GB" if disk else "")
        )
    ring = s.get("prompt_cache") or {}
    least = min(ranks, key=lambda r: r.get("prompt_cache_tokens", 0))
    tokens = ring.get("ram_tokens", least.get("prompt_cache_tokens", 0))
    how = ""
    if "ram_cap_gb" in ring:
        cap = ring["ram_cap_gb"]
        how = (
            "; PROMPT_CACHE_GB=0: off"
            if cap == 0
            else "; half of what the plan leaves a rank (PROMPT_CACHE_GB=auto)"
            if cap is None
            else f"; half of what the plan leaves a rank, at most PROMPT_CACHE_GB={cap:g}"
        )
    lines.append(
        f"RAM tier: {tokens:,} tokens for the ring, as many as rank {least['rank']} holds (a "
        f"block counts only where every rank holds it){how}"
        + (
            f"; the staging is a prompt of KV_TOKENS={s['kv_tokens']} read back from disk"
            if disk and "kv_tokens" in s
            else ""
        )
    )
    return lines


def format_disk(disk: dict, ring: dict) -> str:
    """The line of the disk tier: `disk`, this machine's as `cache_sizes.disk_here` reads it;
    `ring`, the summary's `prompt_cache` (`ring_figures`), for the tokens its cap holds."""
    setting = disk["cap_setting_gb"]
    if setting == 0:
        return "disk tier: off (PROMPT_DISK_GB=0)"
    per_token = ring.get("token_bytes") or 0.0

    def tokens(gb: float) -> str:
        return f"{int(gb * GIB / per_token):,} tokens" if per_token > 0 else "no tokens"

    here = f"in {disk['folder']}, which holds {disk['held_gb']:.1f} GB of blocks now"
    if setting is None:
        return (
            "disk tier: a quarter of each host's free space above its floor, at most "
            f"{disk['auto_most_gb']:g} GB a rank (PROMPT_DISK_GB=auto); on this machine "
            f"{disk['cap_gb']:.1f} GB ({tokens(disk['cap_gb'])}) {here}"
        )
    return (
        f"disk tier: {setting:g} GB a rank (PROMPT_DISK_GB), {tokens(setting)}; on this machine "
        + here
    )
