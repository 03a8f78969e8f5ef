"""Starting ranks with mlx.launch from Python (benchmarks and tests; `launch.sh` does the same in
bash)."""

import socket

# mlx.launch busy-loops on a stdin that is empty or at its end (a core per rank): feed it an open
# pipe with a byte now and then (the ranks close their end at start, after which it stops watching).
STDIN_FEED = "exec 2>/dev/null; while sleep 1; do echo; done"


def under_feed(cmd: list[str]) -> list[str]:
    """`cmd` with its stdin an open pipe that mlx.launch will not spin on."""
    return ["bash", "-c", f'exec "$@" < <({STDIN_FEED})', "feed", *cmd]


def free_port(span: int = 1) -> int:
    """A port p such that p .. p+span-1 were all free a moment ago."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + span < 65000 and all(_is_free(p + i) for i in range(1, span)):
            return p
    raise RuntimeError("no free port range")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
