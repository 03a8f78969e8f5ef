"""The ring's life on rank 0's machine: start it in a session of its own, restart it when it
fails (a bounded number of times), drain it on stop. Plain `subprocess` and signals, the same on
macOS and Linux (no setsid, pkill or timeout: a stock Mac has none of them)."""

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from mlx_ring import exits
from mlx_ring.config import ROOT
from mlx_ring.hosts import ssh
from mlx_ring.launcher.attempt import rank_hosts, run_ring, sweep_hosts
from mlx_ring.launcher.failures import explain, rank_on
from mlx_ring.launcher.healing import Away, hosts_up, restart_hosts, watch_away
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.processes import PYTHON, alive, kill_group, read_pid
from mlx_ring.launcher.ready import EXITED, READY, wait_ready
from mlx_ring.launcher.waiting import read_state, write_state

log = logging.getLogger("launcher")

# seconds; a ring that ran this long before failing starts a fresh restart count
SERVED_A_WHILE = 300


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


def exit_codes(codes: dict, hosts: list[str]) -> str:
    """The ranks' real exit codes (mlx.launch's own is 0 whatever they did)."""
    named = [
        f"{rank_on(r, hosts)}: {'killed' if c is None else f'code {c}'}"
        + (f" ({exits.CAUSES[c]})" if c in exits.CAUSES else "")
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
    # its GPU failed a step: as a crash, a fresh process may not meet it again (MAX_RESTARTS
    # bounds one that does); the cause is named from the rank's line (failures.gpu_failed)
    exits.DEVICE_FAILED: RESTART,
    exits.RING_BROKEN: RESTART,  # a peer left or went silent: a new ring mends it
    exits.HTTP_LOST: RESTART,  # rank 0's HTTP process died: a new one comes with the new ring
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
        # what the ranks printed, named with its fix: a GPU's failure, a ring connect
        causes = explain(out, rank_hosts(s))
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
    """SIGTERM to the supervisor (it drains rank 0, which shuts every rank
    down), then anything left."""
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
