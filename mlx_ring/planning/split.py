"""Whether a model's layers can be shared N ways (tensor mode), from config.json alone: the model
cutter's own arithmetic (`mlx_ring.models.tensor_shares`), as the share of every layer each rank
holds. Pure, no MLX arrays.
"""

from mlx_ring.models.tensor_shares import tensor_shares as cut_shares


def tensor_shares(config: dict, n: int) -> list[float]:
    """Each rank's share of every layer in tensor mode; ValueError (a sentence) where the model cannot be
    split `n` ways."""
    return [s.layer for s in cut_shares(config, n)]
