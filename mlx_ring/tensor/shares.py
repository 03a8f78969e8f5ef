"""Whether a model splits N ways for tensor mode, and each rank's share of it, from its config.json
alone (no weights; its shape as `mlx_ring.models.shape` reads it): the planner's view of what
`mlx_ring.tensor.cut.split_model` does. Both cut by the same arithmetic here: attention by
groups of KV heads (the larger groups to the first ranks) where every rank can have one, else by
query heads with the KV heads they read shared (`head_split`); MLP and experts' columns as evenly
as their quantization groups allow.
"""

import math
from dataclasses import dataclass
from functools import cache

from mlx_ring.models import support
from mlx_ring.models.shape import read_shape


@dataclass(frozen=True)
class Share:
    """One rank's share of a model split for tensor mode."""

    heads: int  # query heads of each layer
    kv_heads: int
    columns: int  # MLP columns of each layer (each expert's, for a mixture of experts)
    # of the whole model's weights this rank holds (embedding, norms and head are on every rank)
    fraction: float
    layer: float = 1.0  # of each layer's weights this rank holds (what its step reads and computes)
    # of each layer's KV cache this rank keeps (a KV head kept by several ranks counts on each)
    cache: float = 1.0


def refuse(kind: str, why: str) -> ValueError:
    """The sentence that refuses a type for tensor mode."""
    return ValueError(f"{kind} can't be split for tensor mode: {why}; use PARALLEL=pipeline")


def record() -> dict:
    """What the tensor-mode matrix found: {"admitted": {type: {"uneven": bool, "shared": bool}},
    "refused": {type: reason}}: "uneven" where its layouts split unevenly, "shared" where KV
    heads kept by several ranks were tested."""
    return support.load().get("tensor", {"admitted": {}, "refused": {}})


def check_admitted(kind: str) -> None:
    """ValueError unless the tensor-mode matrix admitted `kind`."""
    found = record()
    if kind in found["admitted"]:
        return
    why = (
        f"its test split 2 and 3 ways fails: {found['refused'][kind]}"
        if kind in found["refused"]
        else "no test has split it across ranks (docs/models.md lists the types tensor mode takes)"
    )
    raise refuse(kind, why)


def spans(sizes: list[int]) -> list[tuple[int, int]]:
    """Half-open ranges of consecutive sizes."""
    out, at = [], 0
    for s in sizes:
        out.append((at, at + s))
        at += s
    return out


def even(total: int, n: int, unit: int = 1) -> list[int]:
    """`total` split n ways in whole units, as evenly as they allow, the larger shares first."""
    units, extra = divmod(total // unit, n)
    sizes = [(units + (r < extra)) * unit for r in range(n)]
    sizes[-1] += total - sum(sizes)  # a remainder smaller than a unit stays with the last rank
    return sizes


@dataclass(frozen=True)
class Heads:
    """One rank's attention heads in every layer: query heads [start, end), and the model's KV
    head behind each KV head the rank keeps, in order. A KV head may repeat, so that the rank's
    query heads make equal groups over its KV heads, as attention's grouped queries need."""

    start: int
    end: int
    kv: tuple[int, ...]

    @property
    def group(self) -> int:
        """Query heads per KV head on this rank."""
        return (self.end - self.start) // len(self.kv)


def head_split(heads: int, kv: int, n: int) -> list[Heads]:
    """Each of n ranks' attention heads. With at least n KV heads, whole groups of them (the
    larger first), so no KV head is kept twice. With fewer, the query heads as evenly as they go,
    each rank keeping the KV heads its queries read (a KV head several ranks read is kept by
    each, as vLLM does); of the even splits, the one whose busiest rank keeps the fewest KV
    heads, then the fewest in all (found rank by rank, as many ranks' splits are too many to
    try). ValueError (a sentence) where the heads cannot be shared n ways."""
    if heads % kv:
        raise ValueError(f"{heads} query heads are not whole groups of {kv} KV heads")
    g = heads // kv
    if kv >= n:
        return [Heads(a * g, b * g, tuple(range(a, b))) for a, b in spans(even(kv, n))]
    if heads < n:
        raise ValueError(f"{heads} query heads cannot be shared by {n} ranks")
    size, extra = divmod(heads, n)  # `extra` ranks take one query head more

    @cache
    # rank r's heads, after u ranks that took one more
    def reads(r: int, u: int, big: int) -> Heads:
        return _reading(r * size + u, r * size + u + size + big, g)

    # rank r's choices (the larger first) keeping at most `most` KV heads
    def steps(r: int, u: int, most: float):
        return [
            (b, len(reads(r, u, b).kv))
            for b in (1, 0)
            if u + b <= extra and len(reads(r, u, b).kv) <= most
        ]

    @cache
    def busiest(r: int, u: int) -> float:  # the fewest KV heads the busiest of ranks r.. can keep
        return (
            (0 if u == extra else math.inf)
            if r == n
            else min(
                (max(k, busiest(r + 1, u + b)) for b, k in steps(r, u, math.inf)), default=math.inf
            )
        )

    @cache
    # the fewest KV heads ranks r.. keep, none more than the busiest
    def total(r: int, u: int) -> float:
        return (
            (0 if u == extra else math.inf)
            if r == n
            else min(
                (k + total(r + 1, u + b) for b, k in steps(r, u, busiest(0, 0))), default=math.inf
            )
        )

    out, u = [], 0
    for r in range(n):
        b = next(b for b, k in steps(r, u, busiest(0, 0)) if k + total(r + 1, u + b) == total(r, u))
        out.append(reads(r, u, b))
        u += b
    return out


def _reading(a: int, b: int, g: int) -> Heads:
    """Query heads [a, b) with the KV heads they read (`g` query heads to a KV head): runs
    of unequal length repeat their KV head, in runs of their greatest common divisor, so
    the groups are equal."""
    runs = [(j, min(b, (j + 1) * g) - max(a, j * g)) for j in range(a // g, (b - 1) // g + 1)]
    unit = math.gcd(*(length for _, length in runs))
    return Heads(a, b, tuple(j for j, length in runs for _ in range(length // unit)))


def tensor_shares(config: dict, n: int) -> list[Share]:
    """Each of n ranks' share of the model `config` (a config.json) describes, split for tensor
    mode; ValueError, in `split_model`'s words, where it cannot be split n ways."""
    shape = read_shape(config)
    kind = shape.model_type or "?"
    check_admitted(kind)
    heads, hidden = shape.heads, shape.hidden_size
    if not heads or not hidden:
        raise refuse(kind, "its config names no attention heads or hidden size")
    kv = shape.kv_heads
    quant = config.get("quantization") or {}
    unit = quant.get("group_size", 1)
    width = shape.intermediate_size
    experts, expert_width = shape.experts, shape.expert_width
    if n < 1:
        raise ValueError(f"a tensor split needs at least one rank, not {n}")
    try:
        split = head_split(heads, kv, n)
    except ValueError as e:
        raise refuse(kind, str(e)) from None
    head_dim = shape.head_dim
    if quant and any((h.start * head_dim) % unit for h in split):
        raise refuse(
            kind, f"its heads of {head_dim} columns do not fill whole quantization groups of {unit}"
        )
    cols, expert_cols = even(width, n, unit), even(expert_width, n, unit)
    uneven = kv % n or heads % n or any(len(set(c)) > 1 for c in (cols, expert_cols) if sum(c))
    if uneven and n > 1 and not record()["admitted"][kind].get("uneven"):
        raise refuse(
            kind,
            f"its {heads} heads, {kv} KV heads and MLP of {width} columns do not split evenly {n} "
            "ways, and only mlx-lm's shard(), which splits evenly, is tested for it",
        )
    if kv < n and not record()["admitted"][kind].get("shared"):
        raise refuse(
            kind,
            f"its {kv} KV heads are fewer than {n} ranks, and no test has kept a KV head on "
            "several ranks for it",
        )
    # Parameter counts of the standard layout, to weigh heads against columns against
    # what every rank holds.
    attn_q = 2 * hidden * head_dim  # a query head's rows in q and columns in o
    attn_kv = 2 * hidden * head_dim  # a KV head's rows in k and v
    mlp_col = 3 * hidden  # a column's row in gate and up, column in down
    expert_col = mlp_col * (experts + (shape.shared_experts if experts else 0))
    whole_layer = heads * attn_q + kv * attn_kv + width * mlp_col + expert_width * expert_col
    replicated = shape.vocab_size * hidden * (1 if shape.tied else 2)
    layers = shape.layers or 1
    total = replicated + layers * whole_layer
    shares = []
    # latent attention's cache is one for all heads: every rank keeps it whole
    latent = bool(shape.kv_lora_rank)
    for h, c, e in zip(split, cols, expert_cols if expert_width else [0] * n):
        mine = (h.end - h.start) * attn_q + len(h.kv) * attn_kv + c * mlp_col + e * expert_col
        shares.append(
            Share(
                heads=h.end - h.start,
                kv_heads=len(h.kv),
                columns=c,
                fraction=(replicated + layers * mine) / total,
                layer=mine / whole_layer,
                cache=1.0 if latent else len(h.kv) / kv,
            )
        )
    return shares
