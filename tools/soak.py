"""Soak test (not CI): concurrent streams against a running server for a while; no errors allowed,
memory per rank must stay flat.

    ./launch.sh start
    .venv/bin/python tools/soak.py --url http://127.0.0.1:8100 --streams 8 --minutes 10

Every stream loops: a streamed chat completion of a varying prompt and length, now and then one it
abandons mid-stream (a client that goes away). Every 15 s it samples /cluster/status. Writes
`soak.json` (samples and totals) and exits non-zero on any error or on memory growth.
"""

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI


async def stream_loop(client: AsyncOpenAI, i: int, until: float, totals: dict) -> None:
    rng = random.Random(i)
    while time.monotonic() < until:
        n = rng.randint(8, 64)
        abandon = rng.random() < 0.1
        prompt = (
            f"Stream {i}, request {totals['requests']}: tell me about the number "
            f"{rng.randint(1, 10**6)}."
        )
        totals["requests"] += 1
        try:
            stream = await client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=n,
                temperature=rng.choice([0.0, 0.7]),
                stream=True,
            )
            got = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got += 1
                    if abandon and got == 3:
                        await stream.response.aclose()  # the client walks away mid-stream
                        totals["abandoned"] += 1
                        break
            totals["tokens"] += got
        except Exception as e:
            totals["errors"].append(f"{type(e).__name__}: {e}")


async def sample_memory(url: str, until: float, samples: list) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < until:
            ranks = (await http.get(url + "/cluster/status")).json()["ranks"]
            samples.append(
                {
                    "t": round(time.monotonic(), 1),
                    "ranks": [
                        {
                            "rank": r["rank"],
                            "rss_mib": r["rss_kib"] / 1024,
                            "mlx_active_mib": r["mlx_active_memory_kib"] / 1024,
                            "open_sequences": r["open_sequences"],
                        }
                        for r in ranks
                    ],
                }
            )
            await asyncio.sleep(15)


async def main_async(a) -> dict:
    until = time.monotonic() + a.minutes * 60
    totals = {"requests": 0, "tokens": 0, "abandoned": 0, "errors": []}
    samples: list = []
    async with AsyncOpenAI(
        base_url=a.url + "/v1", api_key=a.api_key, timeout=600, max_retries=0
    ) as client:
        await asyncio.gather(
            sample_memory(a.url, until, samples),
            *(stream_loop(client, i, until, totals) for i in range(a.streams)),
        )
    await asyncio.sleep(2)  # let the last abandoned sequences be freed
    await sample_memory(a.url, time.monotonic() + 1, samples)
    return {"totals": totals, "samples": samples}


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8100")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--out", type=Path, default=Path("bench-results/soak.json"))
    a = p.parse_args()
    result = asyncio.run(main_async(a))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    t, samples = result["totals"], result["samples"]
    # Compare the second sample (warm: caches and pools allocated) with the last (all streams done).
    first, last = samples[min(1, len(samples) - 1)]["ranks"], samples[-1]["ranks"]
    growth = [lr["rss_mib"] - fr["rss_mib"] for fr, lr in zip(first, last)]
    print(
        f"{a.streams} streams x {a.minutes} min: {t['requests']} requests, {t['tokens']} streamed "
        f"tokens, {t['abandoned']} abandoned mid-stream, {len(t['errors'])} errors"
    )
    for fr, lr, g in zip(first, last, growth):
        print(
            f"  rank {fr['rank']}: RSS {fr['rss_mib']:.0f} -> {lr['rss_mib']:.0f} MiB ({g:+.0f}), "
            f"MLX active {fr['mlx_active_mib']:.0f} -> {lr['mlx_active_mib']:.0f} MiB, open "
            f"sequences at the end {lr['open_sequences']}"
        )
    for e in t["errors"][:10]:
        print("  error:", e)
    ok = (
        not t["errors"]
        and all(g < 50 for g in growth)
        and all(r["open_sequences"] == 0 for r in last)
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
