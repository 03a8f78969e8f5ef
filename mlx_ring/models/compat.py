"""Every mlx-lm internal this project relies on, in one place: when mlx-lm changes one of them,
this is the file that breaks, and the only one to mend."""

from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import _get_classes


def merge_caches(caches: list[list]) -> list:
    """Several prompts' per-layer caches as one batch cache per layer (mlx-lm's batch generator's)."""
    return _merge_caches(caches)


def drop_spare_room(cache) -> None:
    """Trim a batch cache to the tokens it holds: `extend` pads every row to the larger capacity."""
    if isinstance(cache, BatchKVCache):
        keys, values, offset, left, used = cache.state
        cache.state = keys[..., :used, :], values[..., :used, :], offset, left, used


def model_classes(config: dict) -> tuple[type, type]:
    """(model class, its args class) for a config's `model_type`, as `mlx_lm.load` picks them."""
    return _get_classes(config)
