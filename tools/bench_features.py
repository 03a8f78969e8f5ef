"""Decode speed by request feature, through HTTP: one stream for each feature (greedy, a
temperature, a seed, penalties, a logit bias, alternatives, a JSON schema) and 16 streams of
mixed settings against 16 greedy ones, on a one-rank ring; beside mlx-lm's `generate_step` on
the same model, in the same run, greedy and with the features it has (its own sampler and logits
processors: a temperature with top_p, a presence penalty, a logit bias), so what a feature costs
mlx-lm itself is in the same table.

    .venv/bin/python tools/bench_features.py --model /tmp/llama3-8b --tokens 256 --rounds 3
"""

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path

import mlx.core as mx
from bench_targets import ROOT, ring_target
from mlx_lm import load
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from mlx_lm_loop import one_stream
from openai import AsyncOpenAI

from mlx_ring.serving.sampling import CONTEXT  # the context the server's penalties count

PROMPT = "Write a long story about a lighthouse keeper."
SCHEMA = {
    "type": "object",
    "properties": {"story": {"type": "string"}, "lines": {"type": "integer"}},
    "required": ["story", "lines"],
}
FEATURES = {
    "greedy": {"temperature": 0},
    "temperature 0.7, top_p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "plus a seed": {"temperature": 0.7, "top_p": 0.9, "seed": 7},
    "presence_penalty 0.5": {"temperature": 0, "presence_penalty": 0.5},
    "logit_bias": {"temperature": 0, "logit_bias": {"11": 2.0}},
    "top_logprobs 3": {"temperature": 0, "logprobs": True, "top_logprobs": 3},
    "json_schema": {
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    },
}

# mlx-lm's own sampler and processors for the features it has: (sampler, processors)
PEERS = {
    "greedy": (make_sampler(0.0), None),
    "temperature 0.7, top_p 0.9": (make_sampler(0.7, top_p=0.9), None),
    "presence_penalty 0.5": (
        make_sampler(0.0),
        make_logits_processors(presence_penalty=0.5, presence_context_size=CONTEXT),
    ),
    "logit_bias": (make_sampler(0.0), make_logits_processors(logit_bias={11: 2.0})),
}


async def stream(client: AsyncOpenAI, model: str, tokens: int, settings: dict) -> tuple:
    """(tokens after the first, seconds from the first to the last) of one streamed answer: the
    last is the chunk that ends it (one that carries no text may come before)."""
    first, last, used = None, None, 0
    s = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=tokens,
        stream=True,
        stream_options={"include_usage": True},
        **settings,
    )
    async for chunk in s:
        if chunk.usage:
            used = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter()
        if chunk.choices and chunk.choices[0].finish_reason:
            last = time.perf_counter()
    return used - 1, last - first


async def streams(url: str, model: str, tokens: int, settings: list[dict]) -> float:
    """Tokens/s of all `settings` streamed at once (one stream each), summed."""
    async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none", timeout=600) as client:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(stream(client, model, tokens, s) for s in settings))
    if len(got) == 1:
        return got[0][0] / got[0][1]
    return sum(n + 1 for n, _ in got) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "features.json")
    a = p.parse_args()
    a.pin, a.concurrency, a.server_args = False, [16], []
    (ROOT / "bench-results").mkdir(exist_ok=True)
    model, tokenizer = load(str(a.model))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    results: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for feature, (sampler, processors) in PEERS.items():
            _, line = one_stream(model, prompt, a.tokens, sampler, processors)
            tps = float(re.search(r"decode ([\d.]+) tokens/s", line)[1])
            results.setdefault(f"generate_step, {feature}", []).append(tps)
    del model
    mx.clear_cache()
    mixed = [list(FEATURES.values())[i % len(FEATURES)] for i in range(16)]
    with ring_target(a, a.model, "features", 1, [], {}) as ring:
        name = a.model.name
        for _ in range(a.rounds):
            for feature, settings in FEATURES.items():
                tps = asyncio.run(streams(ring.url, name, a.tokens, [settings]))
                results.setdefault(feature, []).append(tps)
            for label, group in (("16 greedy", [FEATURES["greedy"]] * 16), ("16 mixed", mixed)):
                tps = asyncio.run(streams(ring.url, name, a.tokens, group))
                results.setdefault(label, []).append(tps)
    med = {k: statistics.median(v) for k, v in results.items()}
    base = med["generate_step, greedy"]
    print("| loop | tokens/s (median) | of generate_step | of greedy |\n| --- | --- | --- | --- |")
    for k, v in results.items():
        ref = med["16 greedy"] if k.startswith("16") else med["greedy"]
        ref = base if k.startswith("generate_step") else ref  # mlx-lm's own greedy
        m = med[k]
        print(f"| {k} | {m:.1f} ({min(v):.1f}-{max(v):.1f}) | {m / base:.2f}x | {m / ref:.2f}x |")
    a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
