"""One attempt of the ring: mlx.launch over the planned hostfile until it exits, its output
watched for the first rank that left (rank 0 told at once, with why), and mlx.launch's temporary
files swept on every host after."""

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from mlx_ring import exits
from mlx_ring.config import ROOT
from mlx_ring.hosts import ssh
from mlx_ring.launcher.failures import explain
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.processes import PYTHON, alive, kill_group, read_pid
from mlx_ring.launcher.waiting import reachable
from mlx_ring.ring.leftovers import sweep
from mlx_ring.rundir import LaunchDir, RunDir

log = logging.getLogger("launcher")


def feed(pipe) -> None:
    """mlx.launch busy-loops on an empty or finished stdin: give it an open pipe with a byte now and
    then (local ranks close their end at start, ssh ranks get none from bin/ssh; either way the next
    byte fails to write and it stops watching)."""
    try:
        while True:
            pipe.write(b"\n")
            pipe.flush()
            time.sleep(1)
    except (BrokenPipeError, OSError, ValueError):
        pass


LEFT = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


def rank_hosts(s: LaunchSettings) -> list[str]:
    try:
        return [h["ssh"] for h in json.loads(s.run.launch.hostfile.read_text())]
    except (OSError, ValueError):
        return []


def why_left(
    rank: int, host: str, code: int | None, answers=lambda host: False, log_dir: str = "logs"
) -> str:
    """A sentence for the clients of a ring whose rank `rank` on `host` left, from mlx.launch's
    word; `answers(host)`: whether the host takes ssh now."""
    # ssh exits 255 for its own failure (keepalives unanswered, connection cut), and also when the
    # remote command died by a signal: a host that still answers tells the two apart.
    if code == exits.SSH_ENDED and host != "127.0.0.1" and answers(host):
        return (
            f"rank {rank} on {host} died (killed by a signal, or its ssh session was "
            f"cut) while {host} still "
            f"answers; see {RunDir(Path(log_dir)).rank_log(rank)} on {host}; the ring restarts"
        )
    if code == exits.SSH_ENDED:
        return (
            f"rank {rank} on {host} stopped answering (its ssh session ended: the host is off, "
            "asleep or off the network); the ring restarts once it is back"
        )
    if code in exits.CAUSES:  # a GPU's failure is named from its line: `explain` adds it
        cause = exits.CAUSES[code]
        return f"rank {rank} on {host} exited (code {code}: {cause}); the ring restarts"
    return (
        f"rank {rank} on {host} exited "
        f"({'killed' if code is None else f'code {code}'}); the ring restarts"
    )


def shown_log_dir(s: LaunchSettings) -> str:
    """LOG_DIR as a user finds it on any host: relative to the project's folder when inside it."""
    return str(s.log_dir.relative_to(ROOT)) if s.log_dir.is_relative_to(ROOT) else str(s.log_dir)


def tell_rank0(s: LaunchSettings, reason: str) -> None:
    """Rank 0 fails its requests with `reason` at once (its SIGUSR1), instead of waiting out
    STEP_TIMEOUT on a peer that will not answer. Only a rank 0 on this machine can be told."""
    pid, rank0 = read_pid(s.run.rank_pid(0)), s.run.launch.rank0
    if pid and rank0.is_file() and rank0.read_text().strip() == "127.0.0.1":
        s.run.broken.write_text(reason + "\n")
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


def mlx_launch_argv(
    planned: LaunchDir, ring_port: int, envs: list[str], command: list[str]
) -> list[str]:
    """mlx.launch over the planned hostfile, on the backend `up` chose (ring,
    jaccl or jaccl-ring; the ring's ports, or JACCL's coordinator on rank 0's
    address, start at `ring_port`)."""
    backend = planned.backend.read_text().strip() if planned.backend.is_file() else "ring"
    return [
        str(Path(PYTHON).parent / "mlx.launch"),
        "--backend",
        backend,
        "--hostfile",
        str(planned.hostfile),
        "--starting-port",
        str(ring_port),
        "--cwd",
        str(ROOT),
        *envs,
        "--",
        *command,
    ]


def run_ring(
    s: LaunchSettings,
    args: list[str],
    restarts: int,
    stopping: threading.Event,
    away: dict | None = None,
) -> tuple[dict, str]:
    """One attempt: mlx.launch over the planned hostfile until it exits; ({rank:
    exit code}, its output)."""
    planned, attempt = s.run.launch, s.run.attempt_log
    envs = [x for line in planned.env.read_text().splitlines() if line for x in ("--env", line)]
    envs += ["--env", f"RING_RESTARTS={restarts}"]  # /metrics reports it
    # failed over: /health and /metrics say which hosts the ring serves without, since when and why
    if away:
        envs += ["--env", f"RING_AWAY={json.dumps(away)}"]
    # Its `ssh` is ours (bin/ssh, first on PATH): the ring's ssh options.
    env = {
        **os.environ,
        "PATH": f"{ssh.BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RING_SSH_FILE": str(s.run.ssh_config.resolve()),
    }
    argv = mlx_launch_argv(planned, s.ring_port, envs, [str(ROOT / "launch.sh"), "rank", *args])
    hosts, codes, seen = rank_hosts(s), {}, 0
    s.run.broken.unlink(missing_ok=True)
    with open(attempt, "wb") as out:
        # A process group of its own, so a ring that cannot exit is killed
        # whole, local ranks included.
        p = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        s.run.ring_pgid.write_text(f"{p.pid}\n")
        threading.Thread(target=feed, args=(p.stdin,), daemon=True).start()
        gone_since = None
        while p.poll() is None:
            new = attempt.read_bytes()[seen:]
            # bytes, as read: a replaced undecodable byte must not shift the next read
            seen += len(new)
            text = new.decode(errors="replace")
            for m in LEFT.finditer(text):
                rank, code = int(m.group(1)), m.group(2) and int(m.group(2))
                # the first to leave is the cause
                if not codes and rank != 0 and not stopping.is_set():
                    reason = why_left(
                        rank,
                        hosts[rank] if rank < len(hosts) else "?",
                        code,
                        lambda h: reachable(s.run.ssh_config, h),
                        shown_log_dir(s),
                    )
                    # a Metal error, ...
                    reason = "; ".join(
                        [reason, *explain(attempt.read_text(errors="replace"), hosts)]
                    )
                    log.info("%s", reason)
                    tell_rank0(s, reason)
                codes[rank] = code
            # Rank 0 gone, yet mlx.launch still waits on a rank that cannot exit (stopped
            # or hung): force it.
            r0 = read_pid(s.run.rank_pid(0))
            if r0 and not alive(r0):
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 3:
                    log.info("a rank did not exit after rank 0 left; killing the ring")
                    kill_group(p.pid)
            time.sleep(0.5 if not stopping.is_set() else 0.2)
    output = attempt.read_text(errors="replace")
    codes |= {
        int(m.group(1)): m.group(2) and int(m.group(2))
        for m in LEFT.finditer(output)
        if int(m.group(1)) not in codes
    }
    return codes, output


def sweep_hosts(s: LaunchSettings, kill: bool = False) -> None:
    """mlx.launch's temporary files of the ranks that are gone, removed on every host
    (ring/leftovers.py); a host that does not answer is swept by its next rank instead.
    `kill`: before a ring starts, stale ranks of an earlier ring (on a host that was cut
    off) are killed too."""
    notes = s.run.tempfiles
    sweep(notes, wait=5, kill=kill)
    remote = sorted({h for h in rank_hosts(s) if h != "127.0.0.1"})
    script = 'cd "$1" && exec .venv/bin/python -m mlx_ring.ring.leftovers "$2" "$3"'

    def one(host):
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ssh.argv(s.run.ssh_config, host, script, (ROOT, notes, "--kill" if kill else "-")),
                timeout=20,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in remote]
    for t in threads:
        t.start()
    for t in threads:
        t.join(25)
