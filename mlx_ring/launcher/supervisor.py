"""The ring's life on rank 0's machine: start it in a session of its own, restart it when it
fails (a bounded number of times), drain it on stop. Plain `subprocess` and signals, the same on
macOS and Linux (no setsid, pkill or timeout: a stock Mac has none of them)."""

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mlx_ring import exits
from mlx_ring.config import ROOT
from mlx_ring.hosts import ssh
from mlx_ring.launcher.failures import explain
from mlx_ring.launcher.healing import Away, hosts_up, restart_hosts, watch_away
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.ready import EXITED, READY, wait_ready
from mlx_ring.launcher.waiting import reachable, read_state, write_state
from mlx_ring.ring.leftovers import sweep
from mlx_ring.rundir import LaunchDir, RunDir

log = logging.getLogger("launcher")

PYTHON = sys.executable  # the environment's Python, whatever the system's python3 is
# seconds; a ring that ran this long before failing starts a fresh restart count
SERVED_A_WHILE = 300


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def supervisor_pid(s: LaunchSettings) -> int | None:
    """The running supervisor's pid, or None."""
    pid = read_pid(s.run.launcher_pid)
    return pid if pid and alive(pid) else None


def drain_rank0(s: LaunchSettings) -> None:
    """Rank 0 drains its requests, then shuts every rank down; it may be on another host."""
    try:
        r0 = s.run.launch.rank0.read_text().strip()
    except OSError:
        r0 = "127.0.0.1"
    pidfile = s.run.rank_pid(0)
    if r0 == "127.0.0.1":
        pid = read_pid(pidfile)
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    else:
        subprocess.run(
            ssh.argv(s.run.ssh_config, r0, 'cd "$1" && kill -TERM "$(cat "$2")"', (ROOT, pidfile)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )


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
    """mlx.launch over the planned hostfile, on the backend `up` chose (ring, jaccl or
    jaccl-ring; the ring's ports, or JACCL's coordinator on rank 0's address, start at
    `ring_port`)."""
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
    """One attempt: mlx.launch over the planned hostfile until it exits; ({rank: exit code}, its
    output)."""
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
        # A process group of its own, so a ring that cannot exit is killed whole, local ranks
        # included.
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
                    reason = "; ".join([reason, *explain(attempt.read_text(errors="replace"))])
                    log.info("%s", reason)
                    tell_rank0(s, reason)
                codes[rank] = code
            # Rank 0 gone, yet mlx.launch still waits on a rank that cannot exit (stopped or hung):
            # force it.
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
    (ring/leftovers.py); a host that does not answer is swept by its next rank instead. `kill`:
    before a ring starts, stale ranks of an earlier ring (on a host that was cut off) are killed
    too."""
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


def exit_codes(codes: dict, hosts: list[str]) -> str:
    """The ranks' real exit codes (mlx.launch's own is 0 whatever they did)."""
    named = [
        f"rank {r}{f' on {hosts[r]}' if r < len(hosts) and hosts[r] != '127.0.0.1' else ''}: "
        f"{'killed' if c is None else f'code {c}'}"
        for r, c in sorted(codes.items())
    ]
    return ", ".join(named) or "no rank reported"


# What a ring that ended by itself comes to, by each rank's exit code (mlx_ring/exits.py says what
# each means). A rank mlx.launch killed (None), or any other code (-N: a signal): restart.
RESTART, STOP = "restart", "stop"
ON_EXIT = {
    exits.SHUT_DOWN: RESTART,  # every rank did, unasked: rank 0 drained on another's SIGTERM
    exits.CRASHED: RESTART,  # a bug may not recur; MAX_RESTARTS bounds one that does
    exits.REFUSED: STOP,  # it would refuse again: stop, with its reason
    exits.RING_BROKEN: RESTART,  # a peer left or went silent: a new ring mends it
    exits.SSH_ENDED: RESTART,  # a host gone is waited for first (healing.restart_hosts)
}


def must_stop(codes: dict, out: str, hosts: list[str]) -> str | None:
    """The refusal that stops a ring which ended by itself (a rank that cannot start would fail the
    same way again), or None to restart it. `codes`: {rank: exit code} as mlx.launch named them
    (None: killed; a rank it did not name exited SHUT_DOWN), `out`: the ranks' output."""
    said = exits.refusals(out)
    if said:
        return said[0]
    ended = {r: exits.SHUT_DOWN for r in range(len(hosts))} | codes
    stops = [r for r, c in sorted(ended.items()) if ON_EXIT.get(c, RESTART) == STOP]
    if stops:  # REFUSED with no refusal line (argparse's usage error, say): its output says why
        first = {stops[0]: ended[stops[0]]}
        return exits.refusal(f"{exit_codes(first, hosts)} (see its output in launcher.log)")
    return None


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(s: LaunchSettings, args: list[str]) -> int:
    """Run the ring until stopped (SIGTERM/SIGINT: drain rank 0, which shuts every rank down)."""
    stopping = threading.Event()

    def stop(*_):
        stopping.set()
        drain_rank0(s)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tries, away, take_back = 0, Away(), False
    while True:
        s.run.rank_pid(0).unlink(missing_ok=True)
        if (tries > 0 or take_back) and not restart_hosts(s, args, stopping, away):
            write_state(
                s.state_file,
                "stopped" if stopping.is_set() else "failed",
                why="a host is not ready",
            )
            return 0 if stopping.is_set() else 3
        if not away.hosts:
            write_state(s.state_file, "running", restarts=tries)
        else:  # failed over: take the host back once it answers
            threading.Thread(
                target=watch_away, args=(s, away, stopping, lambda: drain_rank0(s)), daemon=True
            ).start()
        # a rank of an earlier ring on a host that was cut off: gone before this one
        sweep_hosts(s, kill=True)
        t0 = time.monotonic()
        state = read_state(s.state_file) if away.hosts else None
        codes, out = run_ring(
            s, args, tries, stopping, state and {k: state[k] for k in ("hosts", "since", "why")}
        )
        sys.stdout.write(out)  # into launcher.log
        sys.stdout.flush()
        sweep_hosts(s)
        if stopping.is_set():
            write_state(s.state_file, "stopped")
            log.info("ring stopped")
            return 0
        take_back = away.back.is_set()  # drained on purpose, to restart with every host: no failure
        if take_back:
            continue
        why = must_stop(codes, out, rank_hosts(s))
        if why:
            write_state(s.state_file, "failed", why=why)
            log.info("not restarting: %s", why)
            return 3
        tries = 1 if time.monotonic() - t0 > SERVED_A_WHILE else tries + 1
        # what the ranks printed, named with its fix: a Metal error, a ring connect
        causes = explain(out)
        for cause in causes:
            log.info("%s", cause)
        said = "; ".join([exit_codes(codes, rank_hosts(s)), *causes])
        if tries > s.max_restarts:
            write_state(
                s.state_file, "failed", why=f"the ring failed {tries} times in a row ({said})"
            )
            log.info("the ring failed %d times in a row (%s); giving up", tries, said)
            return 1
        log.info("the ring exited (%s); restart %d of %d in 2 s", said, tries, s.max_restarts)
        write_state(s.state_file, "restarting", why=said)
        stopping.wait(2)


def start(s: LaunchSettings, args: list[str]) -> int:
    """Provision, start the supervisor in a session of its own, and wait until rank 0 is healthy."""
    s.log_dir.mkdir(parents=True, exist_ok=True)
    log.info("preparing the model (converted once, then cached)...")
    if subprocess.run(
        [PYTHON, "server.py", "--prepare", *args], cwd=ROOT, stdout=subprocess.DEVNULL
    ).returncode:
        return exits.REFUSED
    log.info("checking and provisioning the hosts in %s...", s.hostfile)
    if hosts_up(s, args):
        return exits.REFUSED
    url = s.url
    log.info("starting the ring...")
    logfile = s.run.launcher_log
    # earlier runs' lines are not this one's
    seen = logfile.stat().st_size if logfile.exists() else 0
    s.run.attempt_log.unlink(missing_ok=True)
    # A session of its own (no controlling terminal, so no SIGHUP when this shell closes), which
    # `stop` reaches with one signal to its process group.
    with open(logfile, "ab") as out:
        sup = subprocess.Popen(
            [PYTHON, "-m", "mlx_ring.launcher.cli", "supervise", *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    s.run.launcher_pid.write_text(f"{sup.pid}\n")
    rc = wait_ready(
        url, s.run.attempt_log, s.run.launch.hostfile, lambda: sup.poll() is None, s.startup_timeout
    )
    if rc == EXITED:
        new = logfile.read_bytes()[seen:].decode(errors="replace")
        why = exits.refusals(new)
        if why:
            log.info("%s", why[-1])
            return exits.REFUSED
        log.info(
            "the ring exited during startup; last lines of %s:\n%s",
            logfile,
            "\n".join(new.splitlines()[-20:]),
        )
        return 1
    if rc != READY:
        log.info("not healthy after %.0fs; see %s", s.startup_timeout, s.log_dir)
        return 1
    log.info("ready: %s/v1 (OpenAI-compatible)", url)
    return 0


def stop(s: LaunchSettings) -> int:
    """SIGTERM to the supervisor (it drains rank 0, which shuts every rank down), then anything
    left."""
    pidfile = s.run.launcher_pid
    pid = supervisor_pid(s)
    if pid is None:
        log.info("not running")
        pidfile.unlink(missing_ok=True)
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + s.drain_timeout + 15
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if alive(pid):  # it could not drain: kill what is left of it and of the ring
        kill_group(pid)
        kill_group(read_pid(s.run.ring_pgid) or pid)
    pidfile.unlink(missing_ok=True)
    log.info("stopped")
    return 0
