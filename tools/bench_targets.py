"""The servers bench.py compares, each started, streamed from and stopped: our ring (pipeline or
tensor), one-rank replicas and mlx-lm's servers, as the run's flags ask for them.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from mlx_ring.ring.launch import free_port, under_feed

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through every `with` of a started target


class Target:
    """A server process we start, stream from, and stop."""

    def __init__(self, name: str, cmd: list[str], env: dict, port: int, ours: bool):
        self.name, self.cmd, self.env, self.port, self.ours = name, cmd, env, port, ours
        self.url = f"http://127.0.0.1:{port}"
        self.urls = [self.url]  # where the streams go, dealt in turn

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            # A SIGTERM (`timeout`, a job's end) must stop the server too: it runs in a session of
            # its own, which the default handler would leave running, holding the GPU and its port.
            signal.signal(signal.SIGTERM, _exit_on_signal)
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


def core_shares(a) -> list[str]:
    """--pin: the cores of each rank of the largest ring ("0,1"), this
    process's cores split evenly."""
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
