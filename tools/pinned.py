"""Run a command on its rank's own cores, as if each rank had a device of its own (Linux):

    mlx.launch ... -- python tools/pinned.py 0/1 -- python server.py ...

"0/1" gives rank 0 core 0 and rank 1 core 1 ("0,1/2,3": two cores each); the rank is MLX_RANK (0
when started alone). OPENBLAS_NUM_THREADS becomes the rank's core count, so its BLAS pool does not
spin threads against each other on one core.
"""

import os
import sys


def cores_of(spec: str, rank: int) -> set[int]:
    """The cores `spec` ("0,1/2,3") gives `rank`."""
    shares = spec.split("/")
    if rank >= len(shares):
        raise ValueError(
            (
                f"core spec {spec!r} names {len(shares)} ranks, not rank {rank}; give "
                "one core list per rank"
            )
        )
    return {int(c) for c in shares[rank].split(",")}


def main() -> None:
    spec, sep, *cmd = sys.argv[1:]
    if sep != "--" or not cmd:
        raise SystemExit(__doc__)
    cores = cores_of(spec, int(os.environ.get("MLX_RANK", "0")))
    os.sched_setaffinity(0, cores)  # inherited by the command and every thread it starts
    os.environ["OPENBLAS_NUM_THREADS"] = str(len(cores))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
