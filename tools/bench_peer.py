"""mlx-lm's own server as a benchmark peer under mlx.launch, one GPU per rank (used by bench.py)."""

import os
import sys

if os.environ.get("CUDA_PER_RANK") == "1":  # must be set before MLX starts
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("MLX_RANK", "0")

from mlx_lm.server import main  # noqa: E402

sys.argv = ["mlx_lm.server", *sys.argv[1:]]
main()
