"""One GPU per rank on a multi-GPU host: with CUDA_PER_RANK=1, rank r sees only GPU r. MLX picks its
device when it starts, so this module imports no MLX and runs before it."""

import os


def one_gpu_per_rank() -> None:
    """Call before the first `import mlx`."""
    if os.environ.get("CUDA_PER_RANK") == "1":
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("MLX_RANK", "0")
