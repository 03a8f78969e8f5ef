"""The streams a bench times through an OpenAI client: one stream's first token and inter-token
gaps, `c` at once against one or more servers, and long prompts of a set token count.
"""

import asyncio
import statistics
import time
from pathlib import Path

from openai import AsyncOpenAI

TOPICS = [
    "the sea",
    "a lighthouse",
    "an old clock",
    "a mountain village",
    "a robot gardener",
    "winter stars",
    "a lost letter",
    "the first train",
    "a quiet library",
    "a desert well",
    "a fox in the snow",
    "a kite",
]


async def stream_one(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> dict:
    try:
        return await _stream(client, model, prompt, max_tokens)
    except Exception as e:  # a server that drops connections under load: counted, not fatal
        return {
            "ttft": None,
            "tokens": 0,
            "itl": [],
            "decode_tps": None,
            "end": time.perf_counter(),
            "error": repr(e),
        }


async def _stream(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    times = []
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    tokens = tokens or len(times)
    if not times:
        return {
            "ttft": None,
            "tokens": 0,
            "itl": [],
            "decode_tps": None,
            "end": time.perf_counter(),
        }
    itl = [b - a for a, b in zip(times, times[1:])]
    span = times[-1] - times[0]
    return {
        "ttft": times[0] - t0,
        "tokens": tokens,
        "itl": itl,
        "end": times[-1],
        "decode_tps": (tokens - 1) / span if span > 0 and tokens > 1 else None,
    }


async def run_concurrency(
    urls: list[str], model: str, c: int, max_tokens: int, round_: int, text: str = ""
) -> dict:
    """`c` streams at once, stream i sent to urls[i % len(urls)]; each prompt `text` after its own
    number (none shares a cached prefix), else a short request for a story."""
    prompts = [
        f"Request {round_}-{i}. "
        + (text or f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}.")
        for i in range(c)
    ]
    clients = [
        AsyncOpenAI(base_url=u + "/v1", api_key="bench", timeout=3600, max_retries=0) for u in urls
    ]
    try:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(
                stream_one(clients[i % len(clients)], model, p, max_tokens)
                for i, p in enumerate(prompts)
            )
        )
    finally:
        for client in clients:
            await client.close()
    wall = max(r["end"] for r in results) - t0
    itl = sorted(x for r in results for x in r["itl"])
    tps = [r["decode_tps"] for r in results if r["decode_tps"]]
    pct = lambda q: itl[min(len(itl) - 1, int(q * len(itl)))] * 1e3 if itl else None  # noqa: E731
    return {
        "concurrency": c,
        "completion_tokens": sum(r["tokens"] for r in results),
        "wall_s": wall,
        "aggregate_tps": sum(r["tokens"] for r in results) / wall,
        "per_stream_decode_tps": statistics.mean(tps) if tps else None,
        "ttft_s_mean": statistics.mean(
            [r["ttft"] for r in results if r["ttft"] is not None] or [float("nan")]
        ),
        "errors": sum("error" in r for r in results),
        "itl_p50_ms": pct(0.5),
        "itl_p99_ms": pct(0.99),
    }


async def ttft(url: str, model: str, prompt: str) -> float:
    async with AsyncOpenAI(
        base_url=url + "/v1", api_key="bench", timeout=3600, max_retries=0
    ) as client:
        return (await stream_one(client, model, prompt, 2))["ttft"]


def long_prompt(tokenizer_dir: Path, n_tokens: int, salt: str) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    unit = (
        f" {salt}: the tide comes in over the grey stones and goes out again, as it has "
        "for a thousand years."
    )
    per = len(tok.encode(unit))
    return "Summarise this text." + unit * max(1, (n_tokens - 40) // per)
