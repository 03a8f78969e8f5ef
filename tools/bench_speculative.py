"""Speculative decoding by prompt lookup: per-stream tokens/s of tasks whose answer repeats
its input (fix a text, edit code, quote), and of one whose answer does not (a story: the cost
when drafts miss), the ring with and without DRAFT_TOKENS beside single-process
mlx_lm.server, in one run. Greedy, so the ring's answer with drafts must be the same text as
without them (checked, reported).

    .venv/bin/python tools/bench_speculative.py --ranks 2 --draft-tokens 6

`--draft-model DIR` adds drafting with a smaller model of the same tokenizer, on the
ring (DRAFT_MODEL) and on mlx_lm.server (its --draft-model);
`tools/early_exit_model.py` makes one offline.

Writes `speculative.json` and `speculative.md` to `--out`.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import httpx
from bench_targets import ROOT, Target, targets  # noqa: E402
from openai import OpenAI

CODE = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order["status"] != "paid":
            continue
        total += order["price"] * order["quantity"]
        count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
"""
TEXT = (
    "The lighthouse keeper climbed the stairs every evening at dusk. He lit the great lamp, wound "
    "the clockwork that turned the lens, and wrote the weather in his log. Ships passed through "
    "the narrow channel between the rocks, and none of them ran aground while he kept the light. "
    "In winter the storms shook the tower, but the lamp never went out."
)
TASKS = {
    "fix spelling": "Fix the spelling mistakes in this text and return the whole corrected text:"
    + "\n\n"
    + TEXT.replace("climbed", "climbd").replace("weather", "wether").replace("channel", "chanel"),
    "edit code": (
        "Rename the variable `total` to `amount` in this Python function. Return "
        "the whole function.\n\n"
    )
    + CODE,
    "quote": "Copy this paragraph exactly, then say in one sentence what it is about:\n\n" + TEXT,
    "story (no lookup)": "Write a long story about a fox in the snow.",
}


def stream(client: OpenAI, model: str, prompt: str, max_tokens: int) -> dict:
    times, parts, tokens = [], [], None
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    span = times[-1] - times[0]
    # Tokens after the first over the time from the first: decode alone (the
    # prompt's prefill is apart).
    return {"tokens": tokens, "decode_tps": (tokens - 1) / span, "text": "".join(parts)}


def drafts(t: Target) -> tuple[int, int]:
    s = httpx.get(t.url + "/cluster/status", timeout=60).json()["speculative"]
    return s["drafted"], s["accepted"]


def run(t: Target, model: str, max_tokens: int) -> dict:
    client = OpenAI(base_url=t.url + "/v1", api_key="bench", timeout=3600, max_retries=0)
    # warm-up: first-call compilation (verify widths too) is not decoding
    stream(client, model, "Say hello.", 48)
    out = {}
    for name, prompt in TASKS.items():
        before = drafts(t) if t.ours else None
        r = stream(client, model, prompt, max_tokens)
        if before:
            drafted, accepted = (b - a for a, b in zip(before, drafts(t)))
            r |= {
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": accepted / drafted if drafted else None,
            }
        out[name] = r
        print(f"{t.name} {name}: {r['decode_tps']:.1f} tokens/s", flush=True)
    return out


def table(results: dict, plain: str, ours: list[str], same: dict) -> list[str]:
    """Markdown rows: tokens/s of every target per task; for each drafting target, its speed
    over plain decoding's, its drafts kept, and whether its text is plain decoding's
    (greedy: it should be)."""
    rows = [
        "| task | "
        + " | ".join(f"{n} tok/s" for n in results)
        + "".join(f" | {n} / plain | {n} acceptance | {n} same text" for n in ours)
        + " |",
        "|---|" + "---|" * (len(results) + 3 * len(ours)),
    ]
    for task in TASKS:
        tps = {n: results[n][task]["decode_tps"] for n in results}
        cells = [f"{x:.1f}" for x in tps.values()]
        for n in ours:
            r = results[n][task]
            cells += [
                f"{tps[n] / tps[plain]:.2f}x",
                f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "no drafts",
                "yes" if same[task][n] else "NO",
            ]
        rows.append(f"| {task} | " + " | ".join(cells) + " |")
    return rows


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default=None, help="MLX model folder (default: the default model, prepared)"
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--draft-tokens", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument(
        "--draft-model",
        type=Path,
        default=None,
        help="also time drafting with this model (same tokenizer): the "
        "ring's DRAFT_MODEL and mlx_lm.server's --draft-model, both with --draft-tokens",
    )
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    a = p.parse_args()
    if a.model is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.model = str(resolve_model(None, CACHE_DIR, "auto"))
    model_dir = Path(a.model)
    a.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "bench-results").mkdir(exist_ok=True)
    ns = argparse.Namespace(
        ranks=[a.ranks],
        peers=[],
        concurrency=[1],
        gpu=a.gpu,
        max_tokens=a.max_tokens,
        server_args=[],
        pin=False,
        shares=[],
    )
    plain = targets(ns, model_dir)[0]
    ns.server_args = ["--draft-tokens", str(a.draft_tokens)]
    spec = targets(ns, model_dir)[0]
    spec.name = f"ring-{a.ranks} lookup k<={a.draft_tokens}"
    extra = []
    if a.draft_model:
        ns.server_args += ["--draft-model", str(a.draft_model)]
        extra.append(targets(ns, model_dir)[0])
        extra[-1].name = f"ring-{a.ranks} draft model k<={a.draft_tokens}"
    ns.ranks, ns.peers = [], ["mlx_lm"]
    peers = targets(ns, model_dir)
    if a.draft_model:
        drafted = targets(ns, model_dir)[0]
        drafted.cmd += [
            "--draft-model",
            str(a.draft_model),
            "--num-draft-tokens",
            str(a.draft_tokens),
        ]
        drafted.name = f"mlx_lm draft model k={a.draft_tokens}"
        peers.append(drafted)
    results = {}
    for t in (plain, spec, *extra, *peers):
        with t:
            results[t.name] = run(t, "default" if t.ours else str(model_dir), a.max_tokens)
    ours = [t.name for t in (spec, *extra)]
    same = {
        task: {n: results[n][task]["text"] == results[plain.name][task]["text"] for n in ours}
        for task in TASKS
    }
    meta = {
        "model": model_dir.name,
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores" if not a.gpu else "GPU",
        "date": time.strftime("%Y-%m-%d"),
        "argv": sys.argv[1:],
        "same_text_with_drafts": same,
    }
    (a.out / "speculative.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1)
    )
    rows = table(results, plain.name, ours, same)
    text = (
        f"Model {meta['model']}, {meta['machine']}, {meta['date']}; "
        f"`{' '.join(['tools/bench_speculative.py', *meta['argv']])}`; "
        f"greedy, {a.max_tokens} tokens at most, one stream at a time\n\n" + "\n".join(rows) + "\n"
    )
    (a.out / "speculative.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
