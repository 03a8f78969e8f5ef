"""`./launch.sh start`'s wait for the ring: a progress bar of ranks that have loaded their layers
(from mlx.launch's output), until rank 0 answers /health. Quiet when stderr is not a terminal.

Exit status: 0 ready, 1 the supervisor exited (the ring failed to start), 2 timed out.
"""

import argparse
import json
import os
import ssl
import sys
import time
import urllib.request
from pathlib import Path

from tqdm import tqdm


def healthy(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # a liveness check, self-signed TLS_CERT too
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2, context=ctx) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--log", type=Path, required=True, help="the attempt's mlx.launch output")
    p.add_argument("--hosts", type=Path, required=True, help="mlx.launch's hostfile (one entry per rank)")
    p.add_argument("--pid", type=int, required=True, help="the supervisor")
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    n = len(json.loads(a.hosts.read_text()))
    deadline = time.monotonic() + a.timeout
    with tqdm(total=n, desc="ranks loaded", unit="rank", disable=None, file=sys.stderr, leave=False) as bar:
        while time.monotonic() < deadline:
            try:
                os.kill(a.pid, 0)
            except ProcessLookupError:
                return 1
            text = a.log.read_text(errors="replace") if a.log.exists() else ""
            loaded = min(n, text.count("] INFO server: loaded layers"))
            bar.update(loaded - bar.n)
            if healthy(a.url):
                bar.update(n - bar.n)
                return 0
            time.sleep(0.5)
    return 2


if __name__ == "__main__":
    sys.exit(main())
