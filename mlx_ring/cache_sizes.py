"""The prompt cache's sizes, as the tiers take them at start (mlx_ring/cache/) and the layer plan
counts and shows them (mlx_ring/planning/): what a block of KV takes at KV_BITS, what a host's disk
tier may hold, and the memory its writes may queue. Plain arithmetic and the file system's figures;
no MLX.
"""

import os
import shutil
from pathlib import Path

from mlx_ring import platform_disk

GIB = 2**30
AUTO_CAP_GB = 100  # the most an unset PROMPT_DISK_GB takes
# The blocks a rank's disk tier holds in memory until its writer has written them, at most: the
# layer plan counts them beside the rank's slice (GPU memory, on a Mac).
WRITE_QUEUE_BYTES = 256 << 20
GROUPS = (64, 32)  # mlx-lm's group first; MLX quantizes in groups of 32, 64 or 128


# --- a block's bytes at KV_BITS ------------------------------------------------------------------


def group_size(columns: tuple[int, ...]) -> int:
    """The group that divides every one of a layer's KV `columns` (a head's): 64, else 32;
    ValueError where neither does."""
    for g in GROUPS:
        if all(c % g == 0 for c in columns):
            return g
    raise ValueError(
        f"KV_BITS quantizes a head's KV columns ({', '.join(map(str, columns))} here) in groups "
        "of 64 or 32, and neither divides them; set KV_BITS=0 for this model"
    )


def head_columns(shape) -> tuple[int, ...]:
    """The columns a layer's cache holds per token and head (models/shape.ModelShape): a head's,
    or, for latent attention, its compressed vector and its rotary key."""
    if shape.kv_lora_rank:
        return tuple(c for c in (shape.kv_lora_rank, shape.rope_head_dim) if c)
    return (shape.head_dim,)


def packed_share(bits: int, group: int, itemsize: int) -> float:
    """A block's bytes at `bits` a value (0: unquantized) per byte of the KV it keeps, whose values
    take `itemsize` bytes: the values, and a scale and a bias per group of `group`."""
    if not bits:
        return 1.0
    return (bits / 8 + 2 * itemsize / group) / itemsize


# --- a host's disk tier --------------------------------------------------------------------------


def disk_folder(prompt_cache_dir: Path | None, cache_dir: Path) -> Path:
    """The folder of this host's blocks: PROMPT_CACHE_DIR, else the platform's own."""
    return prompt_cache_dir or platform_disk.prompt_cache_folder(cache_dir=cache_dir)


def floor_bytes(folder: Path, floor_gb: float | None) -> int:
    """Free bytes below which the disk tier stops writing: the setting, else 20 GiB or a
    tenth of the disk, whichever is more."""
    if floor_gb is not None:
        return int(floor_gb * GIB)
    return max(20 * GIB, shutil.disk_usage(_existing(folder)).total // 10)


def held_bytes(folder: Path) -> int:
    """Bytes of the blocks under `folder` (every scope's; 0 where there is no such folder). A
    folder or block that vanishes meanwhile (another start deleting an old scope's) is skipped."""
    total = 0
    for top, _, names in os.walk(folder):  # a folder gone before it is listed is skipped
        for name in names:
            if name.endswith(".kv"):
                try:
                    total += os.stat(os.path.join(top, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def cap_bytes(folder: Path, disk_gb: float | None, floor: int) -> int:
    """PROMPT_DISK_GB in bytes, else a quarter of the free space above the floor (at most
    AUTO_CAP_GB): the blocks already there count as free, since they are the tier's own."""
    if disk_gb is not None:
        return int(disk_gb * GIB)
    free = shutil.disk_usage(_existing(folder)).free + held_bytes(folder)
    return max(0, min(AUTO_CAP_GB * GIB, (free - floor) // 4))


def _existing(folder: Path) -> Path:
    """`folder`, or the nearest folder above it that exists (its file system's figures)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def disk_here(
    disk_gb: float | None, floor_gb: float | None, prompt_cache_dir: Path | None, cache_dir: Path
) -> dict:
    """This machine's disk tier as a start would size it, read without writing anything:
    `cap_setting_gb` (PROMPT_DISK_GB: None auto, 0 off) and, unless off, its folder, `cap_gb` and
    `held_gb` (the blocks there now, every model's), and `auto_most_gb`."""
    if disk_gb == 0:
        return {"cap_setting_gb": 0}
    folder = disk_folder(prompt_cache_dir, cache_dir)
    cap = cap_bytes(folder, disk_gb, floor_bytes(folder, floor_gb))
    return {
        "cap_setting_gb": disk_gb,
        "folder": str(folder),
        "cap_gb": round(cap / GIB, 2),
        "held_gb": round(held_bytes(folder) / GIB, 2),
        "auto_most_gb": AUTO_CAP_GB,
    }
