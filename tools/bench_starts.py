"""How steady one stream's speed is: each target started --starts times (in turns), each start serving
--requests single-stream requests in turn (the first one right after the server is up).

    python tools/bench_starts.py --model /tmp/llama8b --gpu --starts 5 --requests 4 --max-tokens 256

Reports per start the first request's time to first token and each request's decode tokens/s, and
per target the spread (max/min) of the per-start medians and of the requests within a start.
Writes `starts.json` and `starts.md` to --out.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from bench import ROOT, Target, stream_one, targets  # the script's own folder, tools/, is on the path
from openai import AsyncOpenAI


async def one(url: str, model: str, i: int, max_tokens: int) -> dict:
    async with AsyncOpenAI(base_url=url + "/v1", api_key="bench", timeout=3600, max_retries=0) as client:
        return await stream_one(client, model, f"Request {i}. Write a long, detailed story about the sea.", max_tokens)


def run_start(t: Target, a, model_dir: Path, s: int) -> dict:
    t0 = time.perf_counter()
    with t:
        up = time.perf_counter() - t0
        model = "default" if t.ours else str(model_dir)
        reqs = [asyncio.run(one(t.url, model, s * 100 + i, a.max_tokens)) for i in range(a.requests)]
        memory = t.memory()
    print(f"{t.name} start {s}: up in {up:.1f} s, TTFT {[round(r['ttft'] or 0, 3) for r in reqs]}, "
          f"tok/s {[round(r['decode_tps'] or 0, 1) for r in reqs]}", flush=True)
    return {"start_s": up, "ttft_s": [r["ttft"] for r in reqs], "decode_tps": [r["decode_tps"] for r in reqs], "memory": memory}


def report(results: dict, a, out: Path) -> None:
    (out / "starts.json").write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))
    lines = [f"{a.max_tokens} tokens a request, one stream, {a.requests} requests a start.", "",
             "| target | start | up s | TTFT 1st / 2nd s | decode tok/s per request |", "|---|---|---|---|---|"]
    for name, starts in results.items():
        for i, s in enumerate(starts):
            lines.append(f"| {name} | {i} | {s['start_s']:.1f} | {s['ttft_s'][0]:.3f} / {s['ttft_s'][1]:.3f} | "
                         + ", ".join(f"{x:.1f}" for x in s["decode_tps"]) + " |")
    lines += ["", "| target | median tok/s per start | spread across starts | largest spread within a start | 1st / 2nd TTFT (median) |",
              "|---|---|---|---|---|"]
    for name, starts in results.items():
        med = [statistics.median(s["decode_tps"]) for s in starts]
        within = max(max(s["decode_tps"]) / min(s["decode_tps"]) for s in starts)
        ratio = statistics.median(s["ttft_s"][0] / s["ttft_s"][1] for s in starts)
        lines.append(f"| {name} | {', '.join(f'{m:.1f}' for m in med)} | {max(med) / min(med):.3f}x | {within:.3f}x | {ratio:.2f}x |")
    (out / "starts.md").write_text("\n".join(lines) + "\n")
    print((out / "starts.md").read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--ranks", default="1")
    p.add_argument("--peers", default="mlx_lm")
    p.add_argument("--starts", type=int, default=5)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    p.add_argument("--server-arg", dest="server_args", action="append", default=[], help="extra server.py flag, repeatable")
    a = p.parse_args()
    a.ranks, a.peers = [int(x) for x in a.ranks.split(",")], [x for x in a.peers.split(",") if x]
    a.concurrency, a.pin, a.shares = [1], False, []
    a.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "bench-results").mkdir(exist_ok=True)
    model_dir, results = Path(a.model), {}
    for s in range(a.starts):  # targets take turns, each start on fresh ports
        for t in targets(a, model_dir):
            results.setdefault(t.name, []).append(run_start(t, a, model_dir, s))
            report(results, a, a.out)


if __name__ == "__main__":
    main()
