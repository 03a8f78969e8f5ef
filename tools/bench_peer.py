"""mlx-lm's own server as a benchmark peer under mlx.launch, one GPU per rank (used by bench.py)."""

import sys

from mlx_ring.gpu import one_gpu_per_rank  # noqa: E402

one_gpu_per_rank()  # before MLX starts

from mlx_lm.server import main  # noqa: E402

sys.argv = ["mlx_lm.server", *sys.argv[1:]]
main()
