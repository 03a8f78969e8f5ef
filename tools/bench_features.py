"""Decode speed by request feature, through HTTP: one stream for each feature (greedy, a
temperature, a seed, penalties, a logit bias, alternatives, a JSON schema) and 16 streams of
mixed settings against 16 greedy ones, on a one-rank ring; beside mlx-lm's `generate_step` on
the same model, greedy and with the features it has (its own sampler and logits processors: a
temperature with top_p, a presence penalty, a logit bias), so what a feature costs mlx-lm itself is
in the same table. Each round runs mlx-lm's loop and the server's stream of a feature back to back,
and the ratios are the median of the rounds' own.

    .venv/bin/python tools/bench_features.py --model /tmp/llama3-8b --tokens 256 --rounds 3
"""

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path

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

# 16 streams at once: greedy, and the settings above in turn
GROUPS = {
    "16 greedy": [FEATURES["greedy"]] * 16,
    "16 mixed": [list(FEATURES.values())[i % len(FEATURES)] for i in range(16)],
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
    p.add_argument(
        "--only",
        action="append",
        choices=[*FEATURES, *GROUPS],
        help="this feature alone (again for more; default: all, and the 16-stream pair)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "features.json")
    a = p.parse_args()
    a.pin, a.concurrency, a.server_args = False, [16], []
    only = a.only or [*FEATURES, *GROUPS]
    (ROOT / "bench-results").mkdir(exist_ok=True)
    # mlx-lm's copy stays loaded beside the server's, so each round runs both back to back: on a
    # lent machine whose speed drifts, a round's pair compares where separate runs would not.
    model, tokenizer = load(str(a.model))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    results: dict[str, list[float]] = {}
    # mlx-lm's kernels built before the first timed round, as the server's warm-up builds its own
    for feature in set(only) & set(PEERS):
        one_stream(model, prompt, 8, *PEERS[feature])
    with ring_target(a, a.model, "features", 1, [], {}) as ring:
        for r in range(a.rounds):
            for feature in only:
                if feature in PEERS:
                    _, line = one_stream(model, prompt, a.tokens, *PEERS[feature])
                    tps = float(re.search(r"decode ([\d.]+) tokens/s", line)[1])
                    results.setdefault(f"generate_step, {feature}", []).append(tps)
                    print(f"round {r}: generate_step, {feature} {tps:.1f} tokens/s", flush=True)
                group = GROUPS.get(feature) or [FEATURES[feature]]
                tps = asyncio.run(streams(ring.url, a.model.name, a.tokens, group))
                results.setdefault(feature, []).append(tps)
                print(f"round {r}: {feature} {tps:.1f} tokens/s", flush=True)
            # kept round by round: a run cut short still leaves what it measured
            a.out.write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: dict[str, list[float]]) -> str:
    """Medians and ranges, and each line against mlx-lm's greedy and the ring's (or 16 greedy
    streams') round by round: the median of the rounds' ratios."""
    rows = [
        "| loop | tokens/s, median (range) | of generate_step | of greedy |",
        "| --- " * 4 + "|",
    ]

    def of(k: str, ref: str) -> str:
        if ref not in results or k == ref:
            return "1.00x" if k == ref else ""
        return f"{statistics.median(x / y for x, y in zip(results[k], results[ref])):.2f}x"

    for k, v in results.items():
        ours = "16 greedy" if k.startswith("16") else "greedy"
        ref = "generate_step, greedy"
        mine = of(k, ref if k.startswith("generate_step") else ours)
        rows.append(
            f"| {k} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) | "
            f"{of(k, ref) if not k.startswith('16') else ''} | {mine} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
