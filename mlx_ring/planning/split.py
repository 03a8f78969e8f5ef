"""Whether a model's layers can be shared N ways (tensor mode), from config.json alone. Pure, no MLX.

`tensor_shares` answers with each rank's share, or a ValueError naming what does not divide. The
model cutter's own answer (`mlx_ring.models.tensor.tensor_shares`) wins where it is installed; the
check here follows the cut mlx-lm's `shard()` makes: query and KV heads split evenly between the
ranks, the MLP's (or each expert's) intermediate columns too, and a quantized matrix's input rows in
whole groups.
"""

from collections.abc import Callable


def _text(c: dict) -> dict:
    """A vision-language wrapper keeps the text model's keys in `text_config`."""
    return {**c.get("text_config", {}), **{k: v for k, v in c.items() if k != "text_config"}}


def config_shares(config: dict, n: int) -> list[float]:
    """Each rank's share of every layer (equal), or ValueError saying what does not split `n` ways."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    c = _text(config)
    kind = c.get("model_type", "this model")
    if n == 1:
        return [1.0]
    try:
        heads = int(c["num_attention_heads"])
        kv = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
        experts = c.get("num_experts") or c.get("num_local_experts") or c.get("n_routed_experts") or 0
        inter = int((c.get("moe_intermediate_size") if experts else None) or c.get("block_ff_dim") or c["intermediate_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{kind}: config.json lacks {e}, which the tensor split needs (heads, hidden and "
                         "intermediate sizes)") from None
    wrong = []
    if heads % n:
        wrong.append(f"its {heads} attention heads")
    if kv % n:
        wrong.append(f"its {kv} key-value heads")
    if inter % n:
        what = "experts' intermediate size" if experts else "intermediate size"
        wrong.append(f"its {what} {inter}")
    q = c.get("quantization") or c.get("quantization_config")
    group = q.get("group_size", 64) if isinstance(q, dict) and q.get("bits") else 0
    if group and not wrong:  # a rank's rows of o_proj and down_proj must be whole quantization groups
        if (heads * head_dim // n) % group:
            wrong.append(f"a 1/{n} share of its attention output ({heads * head_dim // n} rows) in groups of {group}")
        if (inter // n) % group:
            wrong.append(f"a 1/{n} share of its intermediate size ({inter // n}) in groups of {group}")
    if wrong:
        raise ValueError(f"{kind} cannot be split {n} ways: {' and '.join(wrong)} do not divide evenly")
    return [1.0 / n] * n


def _cutter() -> Callable[[dict, int], list[float]]:
    """The model cutter's check where it is installed, else this module's."""
    try:
        from mlx_ring.models.tensor import tensor_shares
    except ImportError:
        return config_shares
    return tensor_shares


def tensor_shares(config: dict, n: int) -> list[float]:
    """Each rank's share of every layer in tensor mode; ValueError (a sentence) where the model cannot be
    split `n` ways."""
    return _cutter()(config, n)
