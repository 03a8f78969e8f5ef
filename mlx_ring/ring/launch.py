"""Starting ranks with mlx.launch from Python (benchmarks and tests; `launch.sh` does
the same in bash)."""

import random
import socket

from mlx_ring.platform import ephemeral_ports

# mlx.launch busy-loops on a stdin that is empty or at its end (a core per rank): feed it an open
# pipe with a byte now and then (the ranks close their end at start, after which it stops watching).
STDIN_FEED = "exec 2>/dev/null; while sleep 1; do echo; done"


def under_feed(cmd: list[str]) -> list[str]:
    """`cmd` with its stdin an open pipe that mlx.launch will not spin on."""
    return ["bash", "-c", f'exec "$@" < <({STDIN_FEED})', "feed", *cmd]


def free_port(span: int = 1) -> int:
    """A port p such that p .. p+span-1 were all free a moment ago, below the ports the kernel hands
    to outgoing connections (so none of those takes it before its server binds it)."""
    first = ephemeral_ports()[0]
    for _ in range(200):
        p = random.randrange(10000, first - span)
        if all(_is_free(p + i) for i in range(span)):
            return p
    raise RuntimeError("no free port range")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
