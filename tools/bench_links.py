"""The ring over links like real ones: 2 and 3 test hosts (network namespaces, testhosts.py) whose
links `tc` shapes to a Thunderbolt bridge's bandwidth (10 Gbit/s) and to 1 Gbit Ethernet, beside the
same ranks on loopback, in one run (root needed). Per setting: `./launch.sh check`'s prediction
(stage times plus each measured hop), one stream's decode tokens/s, the aggregate at 16 streams, and
the time to first token of a long prompt.

    .venv/bin/python tools/bench_links.py
"""

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the script's own folder, tools/, is on the path
from bench_streams import long_prompt, run_concurrency, ttft
from testhosts import NetnsHosts, why_not

from mlx_ring.ring.launch import free_port

ROOT = Path(__file__).resolve().parents[1]
LINKS = [
    ("loopback", None),
    ("10 Gbit/s (Thunderbolt bridge)", "10gbit"),
    ("1 Gbit/s Ethernet", "1gbit"),
]


def launch(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "launch.sh"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def one(
    hosts: NetnsHosts, n: int, link: str, rate: str | None, a, tmp: Path, model_dir: Path
) -> dict:
    local = rate is None
    entries = (
        [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * n
        if local
        else [h.entry() for h in hosts.hosts[:n]]
    )
    hostfile = tmp / f"hosts-{n}-{rate}.json"
    hostfile.write_text(json.dumps(entries))
    port = free_port()
    env = {
        **os.environ,
        "RING_SSH_CONFIG": str(hosts.ssh_config),
        "HOSTFILE": str(hostfile),
        "HOST": "0.0.0.0",
        "PORT": str(port),
        "RING_PORT": str(free_port(4)),
        "LOG_DIR": str(tmp / f"logs-{n}-{rate}"),
        "MAX_ACTIVE": "16",
        "STARTUP_TIMEOUT": "300",
    }
    hosts.shape(rate)
    r = launch(env, "start")
    assert r.returncode == 0, r.stderr[-3000:]
    url = f"http://{'127.0.0.1' if local else entries[0]['ips'][0]}:{port}"
    try:
        asyncio.run(run_concurrency([url], "default", 16, 8, round_=-1))  # warm-up
        single = asyncio.run(run_concurrency([url], "default", 1, a.max_tokens, round_=1))
        many = asyncio.run(run_concurrency([url], "default", 16, a.max_tokens, round_=16))
        ttfts = [
            asyncio.run(ttft(url, "default", long_prompt(model_dir, a.long_prompt, f"Note {i}")))
            for i in range(2)
        ]
    finally:
        launch(env, "stop")
    # The preflight's prediction, once the hosts are provisioned and the ring's
    # ports are free again.
    check = launch(env, "check", "--json")
    predicted = (
        json.loads(check.stdout.strip().splitlines()[-1])
        if check.returncode == 0
        else {"error": check.stderr[-500:]}
    )
    plan = predicted.get("plan") or {}
    row = {
        "hosts": n,
        "link": link,
        "rate": rate,
        "per_stream_tps": single["per_stream_decode_tps"],
        "aggregate_16_tps": many["aggregate_tps"],
        "errors": single["errors"] + many["errors"],
        "ttft_long_s": min(ttfts),
        "predicted_tps": plan.get("predicted_tokens_per_s"),
        "hops_ms": plan.get("hops_ms"),
        "links": predicted.get("links"),
    }
    print(json.dumps(row), flush=True)
    return row


def report(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "links.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    lines = [
        f"Default model ({meta['model']}) on {meta['machine']}; {meta['max_tokens']} tokens per "
        f"stream, temperature 0; long prompt {meta['long_prompt']} tokens. Hosts are network "
        "namespaces on this one machine (their ranks share its 2 cores), links shaped with tc "
        "tbf; `predicted` is `./launch.sh check`'s (stage times + measured hops).",
        "",
        "| hosts | link | measured hop (rtt ms, Gbit/s) | per-stream tok/s | predicted tok/s | "
        "predicted / measured | aggregate tok/s at 16 | TTFT long s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hop = ", ".join(f"{rtt:.3f} ms {g:.2f}" for rtt, g in (r["links"] or [])[:1])
        ratio = (
            r["predicted_tps"] / r["per_stream_tps"]
            if r["predicted_tps"] and r["per_stream_tps"]
            else None
        )
        lines.append(
            f"| {r['hosts']} | {r['link']} | {hop or '-'} | {f(r['per_stream_tps'], 2)} | "
            f"{f(r['predicted_tps'], 2)} | "
            f"{f(ratio, 2)} | {f(r['aggregate_16_tps'])} | {f(r['ttft_long_s'], 2)} |"
        )
    (out / "links.md").write_text("\n".join(lines) + "\n")
    print((out / "links.md").read_text())


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--hosts", default="2,3")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--long-prompt", type=int, default=4096)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "links")
    a = p.parse_args()
    reason = why_not()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    model_dir = Path(
        subprocess.run(
            [str(ROOT / ".venv/bin/python"), "server.py", "--prepare"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    rows, tmp = [], Path(tempfile.mkdtemp(prefix="bench-links-"))
    # through `finally`: the test hosts go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    hosts = NetnsHosts(3, tmp / "hosts")
    try:
        for n in map(int, a.hosts.split(",")):
            for link, rate in LINKS:
                rows.append(one(hosts, n, link, rate, a, tmp, model_dir))
    finally:
        hosts.close()
    meta = {
        "model": model_dir.name,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "max_tokens": a.max_tokens,
        "long_prompt": a.long_prompt,
        "date": time.strftime("%Y-%m-%d"),
    }
    report(rows, meta, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
