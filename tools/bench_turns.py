"""A chat in turns: time to first token of each turn of one conversation (a ~2,400-token document,
then follow-up questions), the ring on 2 and 3 ranks beside single-process mlx_lm.server, in one
run. The prompt cache should make turns 2 and 3 prefill only what is new.

    .venv/bin/python tools/bench_turns.py --ranks 2,3

Writes `turns.json` and `turns.md` to `--out`.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import httpx
from bench_streams import long_prompt  # noqa: E402
from bench_targets import ROOT, Target, targets  # noqa: E402
from openai import OpenAI

QUESTIONS = [
    "Summarise the text above in one sentence.",
    "What does the tide do?",
    "Say it again, shorter.",
]


def turn(client: OpenAI, model: str, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    """(time to the first content token, the whole answer) of one streamed turn."""
    t0, first, parts = time.perf_counter(), None, []
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            parts.append(chunk.choices[0].delta.content)
    return (first or time.perf_counter()) - t0, "".join(parts)


def chat(t: Target, model: str, document: str, max_tokens: int) -> dict:
    client = OpenAI(base_url=t.url + "/v1", api_key="bench", timeout=3600, max_retries=0)
    messages, ttfts, prefilled = [], [], []
    for i, q in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": (document + "\n\n" + q) if i == 0 else q})
        before = _prefill(t)
        seconds, answer = turn(client, model, messages, max_tokens)
        after = _prefill(t)
        ttfts.append(seconds)
        prefilled.append(after - before if after is not None else None)
        messages.append({"role": "assistant", "content": answer})
        print(f"{t.name} turn {i + 1}: first token after {seconds:.2f} s", flush=True)
    out = {
        "target": t.name,
        "ttft_s": ttfts,
        "turn3_over_turn1": ttfts[2] / ttfts[0],
        "prefilled_tokens_rank0": prefilled,
    }
    if t.ours:
        out["prompt_cache"] = httpx.get(t.url + "/cluster/status", timeout=60).json()[
            "prompt_cache"
        ]
    return out


def _prefill(t: Target) -> int | None:
    """Token positions rank 0 has prefilled so far (ours only)."""
    if not t.ours:
        return None
    return httpx.get(t.url + "/cluster/status", timeout=60).json()["ranks"][0]["prefill_tokens"]


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default=None, help="MLX model folder (default: the default model, prepared)"
    )
    p.add_argument("--ranks", default="2,3")
    p.add_argument("--peers", default="mlx_lm")
    p.add_argument("--document-tokens", type=int, default=2300)
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    a = p.parse_args()
    if a.model is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.model = str(resolve_model(None, CACHE_DIR, "auto"))
    model_dir = Path(a.model)
    # What bench_targets.targets reads: the ring sizes and the peers to start, with
    # room for one stream.
    a.ranks, a.peers = [int(x) for x in a.ranks.split(",")], [x for x in a.peers.split(",") if x]
    a.concurrency, a.gpu, a.server_args, a.pin, a.shares = [1], False, [], False, []
    a.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "bench-results").mkdir(exist_ok=True)
    document = long_prompt(model_dir, a.document_tokens, "shore").removeprefix(
        "Summarise this text."
    )
    results = []
    for t in targets(a, model_dir):
        with t:
            results.append(chat(t, "default" if t.ours else str(model_dir), document, a.max_tokens))
    meta = {
        "model": model_dir.name,
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "argv": sys.argv[1:],
    }
    (a.out / "turns.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    rows = [
        "| target | turn 1 TTFT s | turn 2 | turn 3 | turn 3 / turn 1 | tokens rank 0 "
        "prefilled per turn |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        pre = (
            " / ".join(str(x) for x in r["prefilled_tokens_rank0"])
            if r["prefilled_tokens_rank0"][0] is not None
            else "n/a"
        )
        rows.append(
            (
                f"| {r['target']} | {r['ttft_s'][0]:.2f} | {r['ttft_s'][1]:.2f} | "
                f"{r['ttft_s'][2]:.2f} | {r['turn3_over_turn1']:.3f} | {pre} |"
            )
        )
    text = (
        (
            f"Model {meta['model']}, {meta['machine']}, {meta['date']}; "
            f"`{' '.join(['tools/bench_turns.py', *meta['argv']])}`\n\n"
        )
        + "\n".join(rows)
        + "\n"
    )
    (a.out / "turns.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
