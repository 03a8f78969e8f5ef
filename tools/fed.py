"""Run a command, typically mlx.launch, with its stdin an open pipe fed a byte a second:

    python tools/fed.py mlx.launch --backend ring --hostfile h2.json -- \\
        python tools/bench_steps.py ...

mlx.launch's threads busy-loop until a byte for its ranks' stdin fails to reach them (the ranks
close it at start), and its main thread also on a stdin at its end: about 1.5 cores on a 2-rank run,
which ranks sharing the machine lose. On a core per rank (2 cores) bench_steps gave 31.7 tokens/s at
8 streams unfed and 60.0 fed. launch.sh and tools/bench.py feed it the same way
(mlx_ring/ring/launch.py).
"""

import os
import signal
import sys

from mlx_ring.ring.launch import under_feed


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    cmd = under_feed(sys.argv[1:])
    # Python ignores SIGPIPE, and exec keeps that: the feeder's echo would then fail for ever
    # instead of ending it once mlx.launch is gone (subprocess restores it; exec does not).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
