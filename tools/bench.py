"""Benchmark this server against single-process mlx_lm.server (and, optionally, mlx-lm's own
distributed server) on the same model and machine, in one run, through a streaming OpenAI client.

    ./launch.sh bench --ranks 1,2,3 --concurrency 1,4,8            # default model, this machine
    ./launch.sh bench --model /tmp/llama3-8b --gpu --ranks 1,2 --peers mlx_lm,mlx_lm_tp
    ./launch.sh bench --pin --ranks 1,2 --concurrency 1,8,16,32 --long-prompt 1536  # a core a rank
    ./launch.sh bench --pin --ranks 1,2 --peers replicas  # and the most any split could give
    ./launch.sh bench --pin --ranks 1,2 --tensor 2        # pipeline-2 and tensor-2 beside one rank

`--peers replicas` runs as many independent one-rank servers as the largest ring has ranks, each on
one rank's cores (--pin) or GPU (--gpu), with the streams dealt round them: what the devices serve
when nothing is split or passed between them, the ceiling for a ring of that many ranks.

Reports per target: time to first token (short prompt, and a long one), per-stream decode tokens/s,
aggregate tokens/s, p50/p99 inter-token latency and each rank's busy fraction (CPU time over wall
time, Linux) at each concurrency, and peak memory per rank. Writes `bench.json`, `bench.md` and
`throughput.png` to `--out`.
"""

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_report import report
from bench_streams import long_prompt, run_concurrency, ttft
from bench_targets import ROOT, Target, core_shares, targets


def bench_target(t: Target, a, model_dir: Path) -> dict:
    model = "default" if t.ours else str(model_dir)
    url = t.url
    # Warm up: the first call of each shape compiles kernels (seconds on CUDA); one short pass at
    # each concurrency meets the batch shapes the timed pass will.
    for c in a.concurrency:
        asyncio.run(run_concurrency(t.urls, model, c, 16, round_=-c))
    # Time to first token: prompts whose numbers differ (no prompt-cache hit) but whose token counts
    # do not, so every target and run meets the same shapes. On CUDA a new shape compiles kernels:
    # warm up with number 0, then take the median of three; a CPU has nothing to compile.
    numbers = range(0 if a.gpu else 1, 4 if a.gpu else 2)

    def timed(prompt) -> list[float]:  # TTFT of each numbered prompt, the warm-up's dropped
        return [asyncio.run(ttft(url, model, prompt(i))) for i in numbers][-3:]

    short = timed(lambda i: f"Say hello {i}.")
    out = {
        "target": t.name,
        "ttft_short_s": statistics.median(short),
        "ttft_short_samples_s": short,
    }
    if a.long_prompt:
        long = timed(lambda i: long_prompt(model_dir, a.long_prompt, f"Note {i}"))
        out |= {
            "ttft_long_s": statistics.median(long),
            "ttft_long_samples_s": long,
            "long_prompt_tokens": a.long_prompt,
        }
    out["runs"] = []
    text = long_prompt(model_dir, a.prompt_tokens, "Note") if a.prompt_tokens else ""
    for c in a.concurrency:
        cpu0, t0 = t.cpu_seconds(), time.perf_counter()
        r = asyncio.run(run_concurrency(t.urls, model, c, a.max_tokens, round_=c, text=text))
        cpu1, wall = t.cpu_seconds(), time.perf_counter() - t0
        # each rank's CPU time over the run's wall time, per core it may use:
        # its cores' busy fraction
        cores = len(a.shares[0].split(",")) if a.pin else 1
        r["busy"] = [
            round((cpu1[k] - cpu0[k]) / wall / cores, 3) for k in sorted(cpu1) if k in cpu0
        ]
        print(
            f"  {t.name} c={c}: {r['aggregate_tps']:.1f} tok/s aggregate, "
            f"{(r['per_stream_decode_tps'] or 0):.1f} per stream, busy {r['busy']}",
            flush=True,
        )
        out["runs"].append(r)
    out["memory"] = t.memory()
    return out


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default=None, help="MLX model folder (default: the default model, prepared)"
    )
    p.add_argument("--ranks", default="1,2", help="ring sizes to run, e.g. 1,2,3")
    p.add_argument(
        "--tensor",
        default="",
        help="ring sizes to run in tensor mode too, e.g. 2,4 (targets tensor-N)",
    )
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--long-prompt", type=int, default=4096, help="tokens in the long TTFT prompt (0: skip)"
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="tokens in each timed stream's prompt (0: a short one)",
    )
    p.add_argument(
        "--peers",
        default="mlx_lm",
        help="mlx_lm, mlx_lm_tp, mlx_lm_pp, replicas (comma-separated; '' for none)",
    )
    p.add_argument("--gpu", action="store_true", help="one GPU per rank (CUDA)")
    p.add_argument(
        "--pin",
        action="store_true",
        help="a device per rank on a CPU (Linux): each rank on its own cores, "
        "this machine's cores split evenly over the largest ring's ranks; 1-rank "
        "targets get one rank's share",
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    p.add_argument(
        "--server-arg",
        dest="server_args",
        action="append",
        default=[],
        help="extra server.py flag, repeatable",
    )
    a = p.parse_args()
    a.ranks = [int(x) for x in a.ranks.split(",") if x]
    a.tensor = [int(x) for x in a.tensor.split(",") if x]
    a.most = max(a.ranks + a.tensor)  # the largest ring's ranks
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    a.peers = [x for x in a.peers.split(",") if x]
    a.shares = core_shares(a) if a.pin else []
    a.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "bench-results").mkdir(exist_ok=True)
    if a.model is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.model = str(resolve_model(None, CACHE_DIR, "auto"))
    model_dir = Path(a.model)
    device = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.split("\n")[0]
        if a.gpu
        else ""
    )
    meta = {
        "model": model_dir.name,
        "machine": device
        or f"{platform.machine()} CPU, {os.cpu_count()} cores"
        + (f", ranks pinned to cores {' / '.join(a.shares)}" if a.pin else ""),
        "max_tokens": a.max_tokens,
        "date": time.strftime("%Y-%m-%d"),
        "argv": sys.argv[1:],
    }
    results = []
    for t in targets(a, model_dir):
        print(f"{t.name}: starting", flush=True)
        with t:
            results.append(bench_target(t, a, model_dir))
        report(results, meta, a.out)  # after each target, so a cut-short run keeps what it measured


if __name__ == "__main__":
    main()
