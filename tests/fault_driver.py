"""server.py with one rank made to skip every FILTER step that keeps rows (some rows leaving a
decode group), as a rank that lost a step would; the others as shipped. Under mlx.launch, in place
of server.py:

    python tests/fault_driver.py RANK server.py ARGS...
"""

import logging
import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    rank, argv = int(sys.argv[1]), sys.argv[2:]
    from mlx_ring.gpu import one_gpu_per_rank

    one_gpu_per_rank()  # before `shard` starts MLX, as server.py does
    import shard  # noqa: I001 (after the line above)

    if int(os.environ.get("MLX_RANK", "0")) == rank:
        real = shard.Shard._filter

        def skipped(self, header, payload):
            keep = payload.tolist() if payload is not None else []
            if not keep:  # a group emptied (as the warm-up's are): no row goes on out of step
                return real(self, header, payload)
            logging.getLogger("fault").warning(
                "skipping FILTER of group %d to %s", header.group, keep
            )
            return payload  # passed on as the real one passes it

        shard.Shard._filter = skipped  # the shard binds its steps when it is built: before that
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
