"""Whether a model's layers can be shared N ways (tensor mode), from config.json alone: the model
cutter's own arithmetic (`mlx_ring.tensor.shares`), as the part of every layer each rank
holds. No weight is read.
"""

from dataclasses import dataclass

from mlx_ring.tensor.shares import tensor_shares as cut_shares


@dataclass(frozen=True)
class ShareSize:
    """How much of every layer one rank holds in tensor mode: the size of its `Share`."""

    layer: float  # of the layer's weights: what the rank reads and computes in a step
    # of the layer's KV cache (more than `layer` where ranks keep a KV head each, or
    # latent attention's whole)
    cache: float


def even_sizes(n: int) -> list[ShareSize]:
    """n equal shares of every layer and its cache."""
    return [ShareSize(1 / n, 1 / n)] * n


def tensor_shares(config: dict, n: int) -> list[ShareSize]:
    """Each rank's part of every layer in tensor mode; ValueError (a sentence) where the model
    cannot be split `n` ways."""
    return [ShareSize(s.layer, s.cache) for s in cut_shares(config, n)]
