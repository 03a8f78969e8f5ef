"""The prompt cache's tiers, set up on every rank at start: the salt of rank 0's block keys, each
rank's disk tier (its folder, its scope and its size), and rank 0's index over the RAM tier.

A block's key (cache/blocks.py) chains from a salt naming the weights, the block size and the
format (KV_BITS included), so no other model's or format's blocks ever match; a rank's disk folder
is scoped by the same and by its own layers and share, so a changed layer plan never loads blocks
cut for another.
"""

import logging
from hashlib import blake2b

from mlx_ring import platform_disk
from mlx_ring.cache.blocks import BlockIndex
from mlx_ring.cache.kvbits import OFF, KVBits
from mlx_ring.cache_sizes import GIB, cap_bytes, disk_folder, floor_bytes

log = logging.getLogger(__name__)


def salt(model_id: str, block: int, kv: KVBits = OFF) -> bytes:
    """What every key chains from: the weights (the manifest's id, which all ranks agree on),
    the block size, the disk format and KV_BITS (quantized and unquantized blocks never mix)."""
    from mlx_ring.cache.disk import FORMAT

    return blake2b(f"{model_id}:{block}:{FORMAT}{kv.tag()}".encode(), digest_size=16).digest()


def scope(key_salt: bytes, layers: tuple[int, int], share: tuple[int, int], dtype: str) -> str:
    """A rank's disk scope: its family (the salt: the model and the format, KV_BITS included),
    then its layers, its tensor share (rank, of) and the KV dtype (cache/scopes.py keeps a
    family's folders and deletes the others': a start with another KV_BITS drops the old)."""
    own = blake2b(f"{layers}:{share}:{dtype}".encode(), digest_size=16).hexdigest()
    return key_salt.hex() + own


def open_disk(cfg, key_salt: bytes, layers, share, dtype: str):
    """This rank's disk tier, or None when PROMPT_DISK_GB is 0 or leaves it no room."""
    if cfg.prompt_disk_gb == 0:
        return None
    from mlx_ring.cache.disk import DiskTier

    folder = disk_folder(cfg.prompt_cache_dir, cfg.cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    platform_disk.exclude_from_backups(folder)
    floor = floor_bytes(folder, cfg.prompt_disk_floor_gb)
    cap = cap_bytes(folder, cfg.prompt_disk_gb, floor)
    if cap <= 0:
        log.info("prompt cache on disk off: %s has no room above its floor", folder)
        return None
    tier = DiskTier(folder, scope(key_salt, layers, share, dtype), cap, floor_bytes=floor)
    st = tier.stats()
    log.info(
        "prompt cache on disk: %s, %.1f GiB of %.1f held (%d blocks)",
        folder,
        st["bytes"] / GIB,
        cap / GIB,
        st["blocks"],
    )
    return tier


def block_index(budget: int, key_salt: bytes, block: int, disk, whole=False) -> BlockIndex:
    """Rank 0's index: the RAM tier within `budget` tokens, rank 0's disk behind it; `whole`:
    whole blocks only (a model whose layers are not all plain KV caches)."""
    index = BlockIndex(budget, key_salt, block, disk.has if disk is not None else None, whole)
    index.disk = disk
    return index
