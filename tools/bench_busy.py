"""What HTTP work costs decoding: one stream's tokens/s on a one-rank ring alone, and while one
client keeps the HTTP side busy (Anthropic's `count_tokens` of a long text, in a loop), rounds
alternated.

    .venv/bin/python tools/bench_busy.py --rounds 5 --words 15000
"""

import argparse
import statistics
import threading
import time
from pathlib import Path

import httpx
from bench_scrape import stream_tps
from bench_targets import ROOT, ring_target


def busy(url: str, text: str, stop: threading.Event, counted: list[int]) -> None:
    """Ask for the token count of `text` until `stop`, one request at a time."""
    with httpx.Client(timeout=120) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        while not stop.is_set():
            r = client.post(f"{url}/v1/messages/count_tokens", json=body)
            r.raise_for_status()
            counted.append(r.json()["input_tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="default: the default model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--words", type=int, default=15000, help="the counted text's length")
    a = p.parse_args()
    if a.model is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.model = resolve_model(None, CACHE_DIR, "auto")
    a.pin, a.concurrency, a.server_args = False, [1], []
    (ROOT / "bench-results").mkdir(exist_ok=True)
    text = " ".join(f"word{i % 997}" for i in range(a.words))
    alone, loaded, counts = [], [], []
    with ring_target(a, a.model, "busy", 1, [], {}) as ring:
        stream_tps(ring.url, 8)  # warm
        for _ in range(a.rounds):
            alone.append(stream_tps(ring.url, a.tokens))
            stop, counted = threading.Event(), []
            t = threading.Thread(target=busy, args=(ring.url, text, stop, counted), daemon=True)
            t.start()
            time.sleep(1.0)  # the counting under way
            loaded.append(stream_tps(ring.url, a.tokens))
            stop.set()
            t.join(120)
            counts.append(len(counted))
    m_alone, m_loaded = statistics.median(alone), statistics.median(loaded)
    print(f"tokens counted: {counted[-1] if counted else 0} a request, {counts} requests a round")
    print("| decode, one stream | tokens/s, median (range) |\n| --- | --- |")
    print(f"| alone | {m_alone:.1f} ({min(alone):.1f}-{max(alone):.1f}) |")
    print(f"| HTTP kept busy | {m_loaded:.1f} ({min(loaded):.1f}-{max(loaded):.1f}) |")
    print(f"busy / alone: {m_loaded / m_alone:.2f}x")


if __name__ == "__main__":
    main()
