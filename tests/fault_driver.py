"""server.py with a fault on one rank, from the moment a file exists (a test makes it once the
server is up: the warm-up runs as shipped); the other ranks as shipped. Under mlx.launch, in place
of server.py:

    FAULT_FILE=PATH python tests/fault_driver.py FAULT RANK server.py ARGS...

FAULT: `skip-filter`, the rank skips every FILTER step (rows leaving a decode group), as a rank
that lost a step would; `hang`, it blocks in its next decode step while its control link's thread
goes on beating, as a rank whose device stopped would.
"""

import logging
import os
import runpy
import sys
import time
from pathlib import Path


def main() -> None:
    fault, rank, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    from mlx_ring.gpu import one_gpu_per_rank

    one_gpu_per_rank()  # before `shard` starts MLX, as server.py does
    import shard  # noqa: I001 (after the line above)

    marker, log = Path(os.environ["FAULT_FILE"]), logging.getLogger("fault")
    if int(os.environ.get("MLX_RANK", "0")) == rank:
        # the shard binds its steps when it is built: patched before that
        if fault == "skip-filter":
            real = shard.Shard._filter

            def skipped(self, header, payload):
                if not marker.exists():
                    return real(self, header, payload)
                log.warning("skipping FILTER of group %d", header.group)
                return payload  # passed on as the real one passes it

            shard.Shard._filter = skipped
        elif fault == "hang":
            real = shard.Shard._decode

            def hung(self, header, payload):
                if marker.exists():
                    log.warning("hanging in a DECODE step of group %d", header.group)
                    time.sleep(3600)  # the interpreter's other threads go on
                return real(self, header, payload)

            shard.Shard._decode = hung
        else:
            raise ValueError(f"no fault {fault!r}; skip-filter or hang")
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
