"""Whether a model splits N ways for tensor mode, and each rank's share of it, from its config.json
alone (no weights, no MLX arrays): the planner's view of what `mlx_ring.models.tensor.split_model`
does. Both cut by the same arithmetic here: attention by groups of KV heads (the larger groups to
the first ranks), MLP and experts' columns as evenly as their quantization groups allow.
"""

from dataclasses import dataclass

from mlx_ring.models import support

HEADS = ("num_attention_heads", "n_heads", "num_heads", "n_head")
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
HIDDEN = ("hidden_size", "d_model", "n_embd", "dim", "model_dim")
WIDTH = ("intermediate_size", "ffn_hidden_size", "n_inner")
EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
EXPERT_WIDTH = ("moe_intermediate_size", "expert_intermediate_size")
SHARED = ("n_shared_experts", "num_shared_experts")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")


@dataclass(frozen=True)
class Share:
    """One rank's share of a model split for tensor mode."""
    heads: int  # query heads of each layer
    kv_heads: int
    columns: int  # MLP columns of each layer (each expert's, for a mixture of experts)
    fraction: float  # of the whole model's weights this rank holds (embedding, norms and head are on every rank)
    layer: float = 1.0  # of each layer's weights this rank holds (what its step reads and computes)


def refuse(kind: str, why: str) -> ValueError:
    """The sentence that refuses a type for tensor mode."""
    return ValueError(f"{kind} can't be split for tensor mode: {why}; use PARALLEL=pipeline")


def record() -> dict:
    """What the tensor-mode matrix found: {"admitted": {type: {"uneven": bool}}, "refused": {type: reason}}."""
    return support.load().get("tensor", {"admitted": {}, "refused": {}})


def check_admitted(kind: str) -> None:
    """ValueError unless the tensor-mode matrix admitted `kind`."""
    found = record()
    if kind in found["admitted"]:
        return
    why = (f"its test split 2 and 3 ways fails: {found['refused'][kind]}" if kind in found["refused"] else
           "no test has split it across ranks (docs/models.md lists the types tensor mode takes)")
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


def _first(config: dict, keys: tuple, default=None):
    return next((config[k] for k in keys if isinstance(config.get(k), int) and config[k] > 0), default)


def tensor_shares(config: dict, n: int) -> list[Share]:
    """Each of n ranks' share of the model `config` (a config.json) describes, split for tensor mode;
    ValueError, in `split_model`'s words, where it cannot be split n ways."""
    kind = config.get("model_type", "?")
    check_admitted(kind)
    text = {**config, **config.get("text_config", {})}
    heads, hidden = _first(text, HEADS), _first(text, HIDDEN)
    if heads is None or hidden is None:
        raise refuse(kind, "its config names no attention heads or hidden size")
    kv = _first(text, KV_HEADS, heads)
    quant = config.get("quantization") or {}
    unit = quant.get("group_size", 1)
    width = _first(text, WIDTH, 0)
    experts, expert_width = _first(text, EXPERTS, 0), _first(text, EXPERT_WIDTH, 0)
    if n < 1:
        raise ValueError(f"a tensor split needs at least one rank, not {n}")
    if kv < n:
        raise refuse(kind, f"{kv} KV heads cannot be shared by {n} ranks")
    if heads % kv:
        raise refuse(kind, f"{heads} query heads are not whole groups of {kv} KV heads")
    per_group, head_dim = heads // kv, text.get("head_dim") or hidden // heads
    kv_sizes = even(kv, n)
    if quant and any((a * per_group * head_dim) % unit for a, _ in spans(kv_sizes)):
        raise refuse(kind, f"its heads of {head_dim} columns do not fill whole quantization groups of {unit}")
    cols, expert_cols = even(width, n, unit), even(expert_width, n, unit)
    uneven = len(set(kv_sizes)) > 1 or heads % n or any(len(set(c)) > 1 for c in (cols, expert_cols) if sum(c))
    if uneven and n > 1 and not record()["admitted"][kind].get("uneven"):
        raise refuse(kind, f"its {heads} heads, {kv} KV heads and MLP of {width} columns do not split evenly {n} ways, "
                           "and only mlx-lm's shard(), which splits evenly, is tested for it")
    # Parameter counts of the standard layout, to weigh heads against columns against what every rank holds.
    attn_q = 2 * hidden * head_dim  # a query head's rows in q and columns in o
    attn_kv = 2 * hidden * head_dim  # a KV head's rows in k and v
    mlp_col = 3 * hidden  # a column's row in gate and up, column in down
    expert_col = mlp_col * (experts + (_first(text, SHARED, 0) if experts else 0))
    whole_layer = heads * attn_q + kv * attn_kv + width * mlp_col + expert_width * expert_col
    vocab = _first(text, ("vocab_size", "padded_vocab_size", "num_vocab"), 0)
    replicated = vocab * hidden * (1 if text.get("tie_word_embeddings", True) else 2)
    layers = _first(text, LAYERS, 1)
    total = replicated + layers * whole_layer
    shares = []
    for k, c, e in zip(kv_sizes, cols, expert_cols if expert_width else [0] * n):
        mine = k * per_group * attn_q + k * attn_kv + c * mlp_col + e * expert_col
        shares.append(Share(heads=k * per_group, kv_heads=k, columns=c, fraction=(replicated + layers * mine) / total,
                            layer=mine / whole_layer))
    return shares
