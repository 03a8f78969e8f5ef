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
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from mlx_ring.ring.launch import free_port, under_feed

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
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


class Target:
    """A server process we start, stream from, and stop."""

    def __init__(self, name: str, cmd: list[str], env: dict, port: int, ours: bool):
        self.name, self.cmd, self.env, self.port, self.ours = name, cmd, env, port, ours
        self.url = f"http://127.0.0.1:{port}"
        self.urls = [self.url]  # where the streams go, dealt in turn

    def __enter__(self):
        self.log = open(ROOT / "bench-results" / f"{self.name}.log", "w")
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see bench-results/{self.name}.log")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not start in 900 s")

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        self.log.close()

    def cpu_seconds(self) -> dict[int, float]:
        """Each rank's CPU time so far (all its threads), by rank (Linux; {} elsewhere)."""
        out = subprocess.run(
            ["pgrep", "-s", str(self.proc.pid)], capture_output=True, text=True
        ).stdout
        tick, ranks = os.sysconf("SC_CLK_TCK"), {}
        for pid in out.split():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                env = dict(
                    x.split(b"=", 1)
                    for x in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    if b"=" in x
                )
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # a rank, not a launcher
            if any(c.endswith((b"server.py", b"mlx_lm.server")) for c in cmd):
                # utime + stime
                ranks[int(env.get(b"MLX_RANK", b"0"))] = (int(stat[11]) + int(stat[12])) / tick
        return ranks

    def memory(self) -> list[dict]:
        """Peak memory per rank: MLX's own count where the server reports it, else the OS's."""
        if self.ours:
            ranks = httpx.get(self.url + "/cluster/status", timeout=30).json()["ranks"]
            # The plan's figure for a rank (`most_gb`): its weights, runtime, the KV room granted
            # and the prompt cache it sets aside; the peak should stay under it.
            plan = [
                r.get("most_gb", r.get("needs_gb", 0.0) + r.get("prompt_cache_gb", 0.0)) * 1024
                for r in ranks
            ]
            return [
                {
                    "rank": r["rank"],
                    "mlx_peak_mib": r["mlx_peak_memory_kib"] / 1024,
                    "rss_mib": r["rss_kib"] / 1024,
                    "weights_mib": r["parameter_bytes_kib"] / 1024,
                    "kv_peak_mib": r["kv_cache_peak_kib"] / 1024,
                    "prompt_cache_mib": r["prompt_cache_kib"] / 1024,
                    "plan_mib": p,
                    "under_plan_mib": p - r["mlx_peak_memory_kib"] / 1024,
                }
                for r, p in zip(ranks, plan)
            ]
        out = subprocess.run(
            ["pgrep", "-s", str(self.proc.pid), "-f", "python"], capture_output=True, text=True
        ).stdout
        rows = []
        for i, pid in enumerate(out.split()):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            hwm = next(
                (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")),
                0,
            )
            if hwm > 100_000:  # skip launcher processes
                rows.append({"rank": len(rows), "rss_peak_mib": hwm / 1024})
        return rows


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
        # each rank's CPU time over the run's wall time, per core it may use: its cores' busy
        # fraction
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


def core_shares(a) -> list[str]:
    """--pin: the cores of each rank of the largest ring ("0,1"), this process's cores split
    evenly."""
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // a.most
    if share < 1:
        raise SystemExit(
            f"--pin needs a core per rank: {len(cores)} cores for rings of up to {a.most} ranks"
        )
    return [",".join(map(str, cores[r * share : (r + 1) * share])) for r in range(a.most)]


def pinned(a, shares: list[str], cmd: list[str]) -> list[str]:
    """`cmd` with rank r on cores shares[r] (--pin), else as it is."""
    return (
        [str(BIN / "python"), str(ROOT / "tools" / "pinned.py"), "/".join(shares), "--", *cmd]
        if a.pin
        else cmd
    )


def ring_target(
    a, model_dir: Path, name: str, n: int, shares: list[str], env: dict, mode: str = "pipeline"
) -> Target:
    """Our server as a ring of `n` local ranks in `mode` (PARALLEL), rank r on shares[r] (--pin)."""
    hostfile = ROOT / "bench-results" / f"hosts-{name}.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * n))
    port = free_port()
    cmd = [
        str(BIN / "mlx.launch"),
        "--backend",
        "ring",
        "--hostfile",
        str(hostfile),
        "--starting-port",
        str(free_port()),
        "--",
        *pinned(a, shares, [str(BIN / "python"), str(ROOT / "server.py")]),
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--max-active",
        str(max(a.concurrency)),
        "--max-queue",
        str(4 * max(a.concurrency)),
        "--log-dir",
        str(ROOT / "bench-results" / f"logs-{name}"),
        "--parallel",
        mode,
        *a.server_args,
    ]
    return Target(name, under_feed(cmd), env, port, ours=True)


class Replicas:
    """Independent one-rank servers, started and stopped together, the streams dealt round them;
    replica i counts as rank i (its busy fraction and memory)."""

    def __init__(self, name: str, parts: list[Target]):
        self.name, self.parts, self.ours = name, parts, True
        self.url, self.urls = parts[0].url, [p.url for p in parts]

    def __enter__(self):
        with ExitStack() as stack:
            for part in self.parts:
                stack.enter_context(part)
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc):
        self.stack.close()

    def cpu_seconds(self) -> dict[int, float]:
        return {i: sum(part.cpu_seconds().values()) for i, part in enumerate(self.parts)}

    def memory(self) -> list[dict]:
        return [m | {"rank": i} for i, part in enumerate(self.parts) for m in part.memory()]


def replica_gpu(a, i: int) -> dict:
    """A replica's environment: GPU i alone (not GPU 0, which CUDA_PER_RANK gives every rank 0)."""
    return {"CUDA_VISIBLE_DEVICES": str(i), "CUDA_PER_RANK": "0"} if a.gpu else {}


def targets(a, model_dir: Path) -> list:
    gpu_env = {"CUDA_PER_RANK": "1"} if a.gpu else {}
    ts = [ring_target(a, model_dir, f"ring-{n}", n, a.shares[:n], gpu_env) for n in a.ranks]
    ts += [
        ring_target(a, model_dir, f"tensor-{n}", n, a.shares[:n], gpu_env, "tensor")
        for n in a.tensor
    ]
    for peer in a.peers:
        port = free_port()
        serve = [
            str(BIN / "mlx_lm.server"),
            "--model",
            str(model_dir),
            "--port",
            str(port),
            "--decode-concurrency",
            str(max(a.concurrency)),
            "--max-tokens",
            str(a.max_tokens),
        ]
        if peer == "mlx_lm":
            ts.append(Target("mlx_lm", pinned(a, a.shares[:1], serve), {}, port, ours=False))
        elif peer == "replicas":  # replica i on rank i's cores, or on GPU i
            n = a.most
            ts.append(
                Replicas(
                    f"replicas-{n}",
                    [
                        ring_target(
                            a, model_dir, f"replica-{i}", 1, a.shares[i : i + 1], replica_gpu(a, i)
                        )
                        for i in range(n)
                    ],
                )
            )
        else:  # mlx-lm's own distributed server over the same ring backend, one rank per GPU
            hostfile = ROOT / "bench-results" / "hosts-peer.json"
            hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * a.most))
            cmd = [
                str(BIN / "mlx.launch"),
                "--backend",
                "ring",
                "--hostfile",
                str(hostfile),
                "--starting-port",
                str(free_port()),
                "--",
                str(BIN / "python"),
                str(ROOT / "tools" / "bench_peer.py"),
                *serve[1:],
                *(["--pipeline"] if peer == "mlx_lm_pp" else []),
            ]
            ts.append(Target(peer, under_feed(cmd), gpu_env, port, ours=False))
    return ts


def ratios(results: list[dict]) -> list[str]:
    """Markdown lines: each ring's aggregate over one rank's, and over the replicas' (the
    ceiling), by concurrency; none without a one-rank ring."""
    agg = {r["target"]: {x["concurrency"]: x["aggregate_tps"] for x in r["runs"]} for r in results}
    base, ceiling = (
        agg.get("ring-1"),
        next((v for k, v in agg.items() if k.startswith("replicas-")), None),
    )
    rings = [k for k in agg if k.startswith(("ring-", "tensor-")) and k != "ring-1"]
    if base is None or not rings:
        return []
    cols = [("ring-1", base)] + ([("replicas", ceiling)] if ceiling else [])
    lines = [
        "",
        "| target | concurrency | "
        + " | ".join(f"aggregate over {name}" for name, _ in cols)
        + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for k in rings:
        for c, v in agg[k].items():
            cells = [f"{v / d[c]:.2f}x" if d.get(c) else "-" for _, d in cols]
            lines.append(f"| {k} | {c} | " + " | ".join(cells) + " |")
    return lines


def report(results: list[dict], meta: dict, out: Path) -> None:
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [
        f"Model `{meta['model']}` on {meta['machine']}; {meta['max_tokens']} tokens per "
        "stream, temperature 0.",
        "",
        "| target | concurrency | aggregate tok/s | per-stream tok/s | TTFT mean s | ITL p50 "
        "ms | ITL p99 ms | failed streams | busy per rank |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in results:
        for run in r["runs"]:
            lines.append(
                f"| {r['target']} | {run['concurrency']} | {f(run['aggregate_tps'])} | "
                f"{f(run['per_stream_decode_tps'])} | {f(run['ttft_s_mean'], 2)} | "
                f"{f(run['itl_p50_ms'])} | {f(run['itl_p99_ms'])} | {run['errors']} | "
                f"{' / '.join(f'{b:.0%}' for b in run.get('busy', [])) or '-'} |"
            )
    lines += ratios(results)
    lines += [
        "",
        "| target | TTFT short s | TTFT long s | peak memory per rank (MiB) |",
        "|---|---|---|---|",
    ]
    for r in results:
        mem = "; ".join(
            f"r{m['rank']}: "
            + ", ".join(f"{k.removesuffix('_mib')} {v:.0f}" for k, v in m.items() if k != "rank")
            for m in r["memory"]
        )
        lines.append(
            f"| {r['target']} | {f(r['ttft_short_s'], 3)} | {f(r.get('ttft_long_s'), 2)} | {mem} |"
        )
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.plot(
            [x["concurrency"] for x in r["runs"]],
            [x["aggregate_tps"] for x in r["runs"]],
            marker="o",
            label=r["target"],
        )
    ax.set(
        xlabel="concurrent streams",
        ylabel="aggregate tokens/s",
        title=f"{meta['model']} on {meta['machine']}",
    )
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    print((out / "bench.md").read_text())


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
