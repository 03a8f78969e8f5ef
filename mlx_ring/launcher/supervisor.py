"""The ring's life on rank 0's machine: start it in a session of its own, restart it when it fails (a
bounded number of times), drain it on stop. Plain `subprocess` and signals, the same on macOS and
Linux (no setsid, pkill or timeout: a stock Mac has none of them)."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mlx_ring.config import ROOT
from mlx_ring.hosts import ssh
from mlx_ring.hosts.ready import EXITED, READY, wait_ready
from mlx_ring.launcher.settings import LaunchSettings

log = logging.getLogger("launcher")

PYTHON = sys.executable  # the environment's Python, whatever the system's python3 is
SERVED_A_WHILE = 300  # seconds; a ring that ran this long before failing starts a fresh restart count


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
    pid = read_pid(s.log_dir / "launcher.pid")
    return pid if pid and alive(pid) else None


def hosts_up(s: LaunchSettings, args: list[str]) -> int:
    """Check and provision every host, plan, and write mlx.launch's inputs (hosts/up.py)."""
    return subprocess.run([PYTHON, "-m", "mlx_ring.hosts.up", "up", "--ring-port", str(s.ring_port),
                           "--out", str(s.planned), *args], cwd=ROOT).returncode


def drain_rank0(s: LaunchSettings) -> None:
    """Rank 0 drains its requests, then shuts every rank down; it may be on another host."""
    try:
        r0 = (s.planned / "rank0").read_text().strip()
    except OSError:
        r0 = "127.0.0.1"
    pidfile = s.log_dir / "rank0.pid"
    if r0 == "127.0.0.1":
        pid = read_pid(pidfile)
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    else:
        subprocess.run(ssh.argv(s.log_dir / "ssh_config", r0, 'cd "$1" && kill -TERM "$(cat "$2")"', (ROOT, pidfile)),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


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


def run_ring(s: LaunchSettings, args: list[str], restarts: int, stopping: threading.Event) -> tuple[int, str]:
    """One attempt: mlx.launch over the planned hostfile until it exits; (exit code, its output)."""
    planned, attempt = s.planned, s.log_dir / "attempt.log"
    envs = [x for line in (planned / "env").read_text().splitlines() if line for x in ("--env", line)]
    envs += ["--env", f"RING_RESTARTS={restarts}"]  # /metrics reports it
    # Its `ssh` is ours (bin/ssh, first on PATH): the ring's ssh options.
    env = {**os.environ, "PATH": f"{ssh.BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "RING_SSH_FILE": str((s.log_dir / "ssh_config").resolve())}
    argv = [str(Path(PYTHON).parent / "mlx.launch"), "--backend", "ring", "--hostfile", str(planned / "hosts.json"),
            "--starting-port", str(s.ring_port), "--cwd", str(ROOT), *envs, "--", str(ROOT / "launch.sh"), "rank", *args]
    with open(attempt, "wb") as out:
        # A process group of its own, so a ring that cannot exit is killed whole, local ranks included.
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                             process_group=0)
        (s.log_dir / "ring.pgid").write_text(f"{p.pid}\n")
        threading.Thread(target=feed, args=(p.stdin,), daemon=True).start()
        gone_since = None
        while p.poll() is None:
            # Rank 0 gone, yet mlx.launch still waits on a rank that cannot exit (stopped or hung): force it.
            r0 = read_pid(s.log_dir / "rank0.pid")
            if r0 and not alive(r0):
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 3:
                    log.info("a rank did not exit after rank 0 left; killing the ring")
                    kill_group(p.pid)
            time.sleep(0.5 if not stopping.is_set() else 0.2)
    return p.returncode, attempt.read_text(errors="replace")


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
    tries = 0
    while True:
        (s.log_dir / "rank0.pid").unlink(missing_ok=True)
        # Before a restart, the hosts again: one that went away is named in a sentence, not retried.
        if tries > 0 and hosts_up(s, args):
            log.info("not restarting: a host is not ready (above)")
            return 3
        t0 = time.monotonic()
        rc, out = run_ring(s, args, tries, stopping)
        sys.stdout.write(out)  # into launcher.log
        sys.stdout.flush()
        if stopping.is_set():
            log.info("ring stopped")
            return 0
        # A rank that cannot start (a setting, a model, a host that differs) fails the same way again.
        why = next((line[line.index("cannot start: "):] for line in out.splitlines() if "cannot start: " in line), None)
        if why:
            log.info("not restarting: %s", why)
            return 3
        tries = 1 if time.monotonic() - t0 > SERVED_A_WHILE else tries + 1
        if tries > s.max_restarts:
            log.info("the ring failed %d times in a row (exit %d); giving up", tries, rc)
            return 1
        log.info("the ring exited with code %d; restart %d of %d in 2 s", rc, tries, s.max_restarts)
        time.sleep(2)


def start(s: LaunchSettings, args: list[str]) -> int:
    """Provision, start the supervisor in a session of its own, and wait until rank 0 is healthy."""
    s.log_dir.mkdir(parents=True, exist_ok=True)
    log.info("preparing the model (converted once, then cached)...")
    if subprocess.run([PYTHON, "server.py", "--prepare", *args], cwd=ROOT, stdout=subprocess.DEVNULL).returncode:
        return 2
    log.info("checking and provisioning the hosts in %s...", s.hostfile)
    if hosts_up(s, args):
        return 2
    url = s.url
    log.info("starting the ring...")
    logfile = s.log_dir / "launcher.log"
    seen = logfile.stat().st_size if logfile.exists() else 0  # earlier runs' lines are not this one's
    (s.log_dir / "attempt.log").unlink(missing_ok=True)
    # A session of its own (no controlling terminal, so no SIGHUP when this shell closes), which
    # `stop` reaches with one signal to its process group.
    with open(logfile, "ab") as out:
        sup = subprocess.Popen([PYTHON, "-m", "mlx_ring.launcher.cli", "supervise", *args], cwd=ROOT,
                               stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (s.log_dir / "launcher.pid").write_text(f"{sup.pid}\n")
    rc = wait_ready(url, s.log_dir / "attempt.log", s.planned / "hosts.json", lambda: sup.poll() is None,
                    s.startup_timeout)
    if rc == EXITED:
        new = logfile.read_bytes()[seen:].decode(errors="replace")
        why = [line[line.index("cannot start: "):] for line in new.splitlines() if "cannot start: " in line]
        if why:
            log.info("%s", why[-1])
            return 2
        log.info("the ring exited during startup; last lines of %s:\n%s", logfile, "\n".join(new.splitlines()[-20:]))
        return 1
    if rc != READY:
        log.info("not healthy after %.0fs; see %s", s.startup_timeout, s.log_dir)
        return 1
    log.info("ready: %s/v1 (OpenAI-compatible)", url)
    return 0


def stop(s: LaunchSettings) -> int:
    """SIGTERM to the supervisor (it drains rank 0, which shuts every rank down), then anything left."""
    pidfile = s.log_dir / "launcher.pid"
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
        kill_group(read_pid(s.log_dir / "ring.pgid") or pid)
    pidfile.unlink(missing_ok=True)
    log.info("stopped")
    return 0
