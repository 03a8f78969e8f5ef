"""What scraping /metrics costs decoding: one stream's tokens/s against a running server, with and
without a scraper polling /metrics (each scrape sends one STATUS step round the ring), alternated.

    ./launch.sh start
    .venv/bin/python tools/bench_scrape.py --url http://127.0.0.1:8100 --interval 1
"""

import argparse
import json
import statistics
import threading
import time

import httpx

EOS_OFF = {"2": -100}  # SmolLM2's end token: forbidden, so every stream runs its full length


def stream_tps(url: str, tokens: int) -> float:
    body = {
        "messages": [{"role": "user", "content": "Tell a long story about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "logit_bias": EOS_OFF,
        "stream": True,
    }
    times = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if (
                line.startswith("data: {")
                and '"content": "' in line
                and '"content": ""' not in line
            ):
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8100")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between scrapes (Prometheus' default is 15)",
    )
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    stream_tps(a.url, 16)  # warm-up
    plain, scraped, scrapes = [], [], [0]
    for _ in range(a.rounds):
        plain.append(stream_tps(a.url, a.tokens))
        stop = threading.Event()

        def scrape():
            while not stop.wait(a.interval):
                httpx.get(f"{a.url}/metrics", timeout=30).raise_for_status()
                scrapes[0] += 1

        t = threading.Thread(target=scrape)
        t.start()
        scraped.append(stream_tps(a.url, a.tokens))
        stop.set()
        t.join()
    m0, m1 = statistics.median(plain), statistics.median(scraped)
    print(
        json.dumps(
            {
                "tokens_per_stream": a.tokens,
                "scrape_interval_s": a.interval,
                "scrapes": scrapes[0],
                "plain_tps": [round(x, 2) for x in plain],
                "scraped_tps": [round(x, 2) for x in scraped],
                "median_plain": round(m0, 2),
                "median_scraped": round(m1, 2),
                "cost": round(1 - m1 / m0, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
