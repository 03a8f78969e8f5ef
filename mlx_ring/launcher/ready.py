"""`./launch.sh start`'s wait for the ring: a progress bar of ranks that have loaded their layers
(from mlx.launch's output), until rank 0 answers /health. Quiet when stderr is not a terminal."""

import json
import ssl
import sys
import time
import urllib.request
from pathlib import Path

from tqdm import tqdm

READY, EXITED, TIMED_OUT = 0, 1, 2


def healthy(url: str) -> bool:
    ctx = ssl.create_default_context()
    # a liveness check, self-signed TLS_CERT too
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2, context=ctx) as r:
            return r.status == 200
    except OSError:
        return False


def wait_ready(url: str, log: Path, hostfile: Path, alive, timeout: float) -> int:
    """READY once /health answers, EXITED as soon as `alive()` (the supervisor)
    is false, else TIMED_OUT."""
    n = len(json.loads(hostfile.read_text()))
    deadline = time.monotonic() + timeout
    with tqdm(
        total=n, desc="ranks loaded", unit="rank", disable=None, file=sys.stderr, leave=False
    ) as bar:
        while time.monotonic() < deadline:
            if not alive():
                return EXITED
            text = log.read_text(errors="replace") if log.exists() else ""
            bar.update(min(n, text.count("] INFO server: loaded layers")) - bar.n)
            if healthy(url):
                bar.update(n - bar.n)
                return READY
            time.sleep(0.5)
    return TIMED_OUT
