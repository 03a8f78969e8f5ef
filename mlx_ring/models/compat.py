"""Every mlx-lm internal this project relies on, in one place: when mlx-lm changes one of them,
this is the file that breaks, and the only one to mend."""

from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList, KVCache, RotatingKVCache
from mlx_lm.utils import _get_classes


def merge_caches(caches: list[list]) -> list:
    """Several prompts' per-layer caches as one batch cache per layer
    (mlx-lm's batch generator's)."""
    return _merge_caches(caches)


def lone_group(caches: list) -> list:
    """A lone prompt's per-layer caches as a decode group of one row: mlx-lm's batch caches of them,
    or, where a layer's kind has no batch form (Llama 4's chunked attention), the caches themselves,
    all of them, so offsets stay plain numbers, as the model's code expects then (its type decodes
    one row a group: support.UNBATCHED)."""
    return [c.merge([c]) for c in caches] if all(hasattr(c, "merge") for c in caches) else caches


def drop_spare_room(cache) -> None:
    """Trim a batch cache to the tokens it holds: `extend` pads every row to the larger capacity."""
    if isinstance(cache, BatchKVCache):
        keys, values, offset, left, used = cache.state
        cache.state = keys[..., :used, :], values[..., :used, :], offset, left, used


def trim_rows(cache: BatchKVCache, drops: list[int]) -> None:
    """Drop the last `drops[i]` positions of each row `i` of a decode group's cache (drafts the
    target rejected). Rows that drop more than the fewest are shifted right by the difference, and
    their left padding grows by as much: a row's tokens keep their positions, so RoPE and the mask
    stay exact, as in mlx-lm's own `filter`, which shifts the other way."""
    fewest = min(drops)
    cache.trim(fewest)
    if max(drops) > fewest:
        extra = mx.array([d - fewest for d in drops])
        n = cache._idx
        # (B, 1, n, 1)
        where = mx.maximum(mx.arange(n)[None, :] - extra[:, None], 0)[:, None, :, None]
        for name in ("keys", "values"):
            a = getattr(cache, name)
            a[..., :n, :] = mx.take_along_axis(
                a[..., :n, :], mx.broadcast_to(where, (*a.shape[:2], n, 1)), axis=2
            )
        cache.left_padding = cache.left_padding + extra
        cache.offset = cache.offset - extra


def positions(caches: list):
    """Tokens a slice's caches have seen: an int (a lone prompt's), one per row (a batch's, less
    its left padding), or None where every layer keeps a fixed state instead (a convolution's, an
    SSM's). A layer with several caches (a `CacheList`: attention beside a state, or beside an
    indexer) counts by its parts."""
    parts = (p for c in caches for p in (c.caches if isinstance(c, CacheList) else (c,)))
    return next((p.offset for p in parts if hasattr(p, "offset")), None)


def model_classes(config: dict) -> tuple[type, type]:
    """(model class, its args class) for a config's `model_type`, as `mlx_lm.load` picks them."""
    return _get_classes(config)


def plain_kv_caches(caches: list) -> bool:
    """Whether these per-layer caches are all plain KV caches, whose first n positions hold
    exactly the first n tokens: they can be saved and reused by prefix (`shard.Shard`'s
    SAVE and LOAD steps), trimmed, and right-padded in a batch's prefill (the padding is
    rolled out after it)."""
    return bool(caches) and all(type(c) is KVCache for c in caches)


def prefill_span(cache, row: int, start: int, end: int) -> tuple:
    """Row `row`'s positions [start, end) of a prefill cache (a lone `KVCache` or a right-padded
    `BatchKVCache`, whose rows start at position 0), as compact arrays of their own."""
    return tuple(
        mx.contiguous(a[row : row + 1, :, start:end, :]) for a in (cache.keys, cache.values)
    )


def group_span(cache: BatchKVCache, row: int, n: int, start: int, end: int) -> tuple:
    """Positions [start, end) of the `n` tokens of row `row` of a decode group's left-padded
    cache, whose tokens are its last `n` positions, as compact arrays (not mlx-lm's `extract`,
    which waits for the padding on every call)."""
    base = cache._idx - n
    return tuple(
        mx.contiguous(a[row : row + 1, :, base + start : base + end, :])
        for a in (cache.keys, cache.values)
    )


def cache_from_saved(saved: tuple, n: int) -> KVCache:
    """A lone prompt's cache holding the first `n` positions of `saved` (new arrays, so writing to
    the cache never touches the saved ones)."""
    c = KVCache()
    c.keys, c.values = (a[..., :n, :] for a in saved)
    c.offset = n
    return c


# What a prompt-cache block keeps of a cache part, where not all are plain KV (cache/states.py)
KV, WINDOW, STATE = "kv", "window", "state"


def block_parts(cache) -> tuple:
    """The parts of a layer's cache that a block keeps apart (a `CacheList`'s, or the cache)."""
    return tuple(cache.caches) if isinstance(cache, CacheList) else (cache,)


def part_kind(part) -> str | None:
    """KV, WINDOW or STATE, or None for a kind no block can keep (Llama 4's chunked attention)."""
    if type(part) is KVCache:
        return KV
    if type(part) is RotatingKVCache:
        return WINDOW
    return STATE if isinstance(part, ArraysCache) else None


def block_cacheable(caches: list) -> bool:
    """Whether every part of these per-layer caches is of a kind a block can keep: by positions (a
    KV cache, a sliding window: its last positions are its state) or by its state at the block's
    end (a convolution's or an SSM's arrays)."""
    return bool(caches) and all(part_kind(p) for c in caches for p in block_parts(c))


def window_positions(cache: RotatingKVCache, n: int) -> tuple:
    """The `n` positions a sliding window took in last, in order, as compact arrays."""
    return tuple(
        mx.contiguous(cache._temporal_order(a)[..., -n:, :]) for a in (cache.keys, cache.values)
    )


def state_arrays(cache: ArraysCache) -> tuple:
    """A fixed state's arrays as they are now (an empty one for an array not set yet)."""
    return tuple(a if a is not None else mx.zeros((0,)) for a in cache.cache)


def _span(parts: list[tuple], j: int, lo: int, hi: int) -> mx.array:
    """Positions [lo, hi) of array `j` of consecutive whole blocks' `parts`."""
    per = parts[0][j].shape[2]
    first, last = lo // per, -(-hi // per)
    joined = mx.concatenate([p[j] for p in parts[first:last]], axis=2)
    return joined[..., lo - first * per : hi - first * per, :]


def restore_part(part, parts: list[tuple], n: int):
    """`part`, a fresh cache part, holding a prompt's first `n` tokens (whole blocks), from each
    block's record of it in order: positions joined, or the last block's state."""
    kind = part_kind(part)
    if kind == STATE:
        part.cache = [a if a.size else None for a in parts[-1]]
        return part
    if kind == KV or n <= part.max_size:
        kv = tuple(_span(parts, j, 0, n) for j in (0, 1))
    else:  # its first `keep` positions and its last ones, as a prefill chunk leaves them
        last = n - (part.max_size - part.keep)
        kv = tuple(
            mx.concatenate(
                ([_span(parts, j, 0, part.keep)] if part.keep else []) + [_span(parts, j, last, n)],
                axis=2,
            )
            for j in (0, 1)
        )
    part.keys, part.values, part.offset = *kv, n
    if kind == WINDOW:
        part._idx = kv[0].shape[2]
    return part


# passes of several positions over a growing cache: see below
UNFUSED_SEVERAL = mx.cuda.is_available()
# On CUDA a prefill chunk over at most this many key positions attends unfused: the fused kernel is
# built anew for each new (query, key) length pair, so a prompt of a length not met before waits for
# a build and stalls the next step; unfused, it costs a little on every prompt and never stalls. The
# scores stay small below this bound, and are gone once the layer is done.
# the plan's activation figure counts the scores up to it (planning/activations.py)
UNFUSED_PREFILL_KEYS = 2048
_FUSED = mx.fast.scaled_dot_product_attention


@contextmanager
def unfused_attention(enabled: bool = True):
    """Within this block, models built lazily attend with plain matmuls and a softmax instead of
    MLX's fused kernel. On CUDA (MLX 0.32.4) the fused kernel for several query positions is
    compiled anew for every key length, about 45 ms each on an H200: a verify pass, whose keys grow
    by a token or more each step, would pay that every step. One position, or a CPU, does not."""
    if not enabled:
        yield
        return
    fused = mx.fast.scaled_dot_product_attention
    mx.fast.scaled_dot_product_attention = _attention
    try:
        yield
    finally:
        mx.fast.scaled_dot_product_attention = fused


def _attention(q, k, v, *, scale: float, mask=None, sinks=None):
    if sinks is not None:  # attention sinks (GPT-OSS): the fused kernel alone adds them
        return _FUSED(q, k, v, scale=scale, mask=mask, sinks=sinks)
    B, H, L, D = q.shape
    kv_heads, n = k.shape[1], k.shape[2]
    q = q.reshape(B, kv_heads, H // kv_heads, L, D)  # query heads grouped by the KV head they share
    scores = (q * scale) @ mx.expand_dims(k, 2).swapaxes(-1, -2)  # (B, kv_heads, group, L, n)
    if isinstance(mask, str):  # "causal": the queries are the last L of the n positions
        mask = mx.arange(n - L, n)[:, None] >= mx.arange(n)[None]
    if mask is not None:
        # (B, 1, L, n) -> (B, 1, 1, L, n)
        mask = mx.expand_dims(mask, 2) if mask.ndim == 4 else mask
        scores = mx.where(mask, scores, -mx.inf) if mask.dtype == mx.bool_ else scores + mask
    weights = mx.softmax(scores.astype(mx.float32), axis=-1).astype(v.dtype)
    return (weights @ mx.expand_dims(v, 2)).reshape(B, H, L, -1)
