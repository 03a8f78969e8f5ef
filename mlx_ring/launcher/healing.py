"""Bringing the hosts back before a restart: a host that went away (or a Mac whose Thunderbolt
addresses were reset) is waited for as long as the supervisor runs; with FAILOVER_AFTER set,
the ring serves without it meanwhile (when the others can hold the model), and takes it back
once it is back."""

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlx_ring.config import ROOT
from mlx_ring.hostfile import (
    format_hostfile,
    named_backend,
    read_hostfile,
    ring_backend,
    without_ranks,
)
from mlx_ring.hosts import ssh
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.waiting import (
    POLL_S,
    DownServer,
    reachable,
    read_state,
    wait_for,
    write_state,
)
from mlx_ring.platform import parse_ifconfig

log = logging.getLogger("launcher")

# A host the ring serves without answers every poll this long, then computes on its device, before
# it is taken back: a Mac's Power Nap wakes it for moments, its network on and its GPU off, and a
# ring taken back then would fail again at once.
STEADY_S = 15.0
PROBE = "import mlx.core as mx; a = mx.ones((256, 256)); mx.eval(a @ a); print('probe: ok')"


@dataclass
class Away:
    """Hosts the ring serves without (failed over), and whether they are back."""

    hosts: list[str] = field(default_factory=list)
    back: threading.Event = field(default_factory=threading.Event)
    # host -> the ring address it must hold again to be back
    addresses: dict = field(default_factory=dict)


def is_back(conf: Path, host: str, address: str | None = None) -> bool:
    """Whether `host` answers over ssh again, or, given the ring `address` it
    lost, holds it again."""
    if address is None:
        return reachable(conf, host)
    try:
        out = ssh.run_on(
            conf,
            host,
            host == "127.0.0.1",
            "PATH=$PATH:/sbin; ifconfig 2>/dev/null",
            timeout=POLL_S + 10,
        )
    except (ValueError, subprocess.TimeoutExpired):  # ssh.SshError included
        return False
    return any(a == address for _, a in parse_ifconfig(out.stdout))


def hosts_up(s: LaunchSettings, args: list[str], hostfile: Path | None = None) -> int:
    """Check and provision every host (of `hostfile`, else HOSTFILE), plan, and
    write mlx.launch's inputs."""
    env = {**os.environ, **({"HOSTFILE": str(hostfile)} if hostfile else {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mlx_ring.launcher.up",
            "up",
            "--ring-port",
            str(s.ring_port),
            "--out",
            str(s.planned),
            *args,
        ],
        cwd=ROOT,
        env=env,
    ).returncode


def without(s: LaunchSettings, hosts: list[str]) -> Path | None:
    """A hostfile of HOSTFILE's entries less `hosts`' (None if none is left)."""
    entries, envs = read_hostfile(ROOT / s.hostfile)
    entries = without_ranks(entries, [i for i, e in enumerate(entries) if e["ssh"] not in hosts])
    if not entries:
        return None
    backend = named_backend(ROOT / s.hostfile)
    try:
        ring_backend(entries, backend)
    except ValueError as e:
        # The Macs left may not be cabled to each other (a JACCL ring less one): their `ips` still
        # reach each other, so the ring heals over TCP until the host is back.
        log.info(
            "without %s, RDMA cannot join the rest (%s): failing over to TCP", ", ".join(hosts), e
        )
        entries, backend = [{k: v for k, v in x.items() if k != "rdma"} for x in entries], ""
    path = s.run.launch.failover_hostfile
    path.write_text(format_hostfile(entries, envs, backend))
    return path


def fail_over(s: LaunchSettings, args: list[str], hosts: list[str], why: str) -> bool:
    """Plan and provision the ring without `hosts`; True when the others can hold the model."""
    reduced = without(s, hosts)
    if reduced is None or hosts_up(s, args, reduced):
        log.info(
            "no failover: the ring cannot serve without %s (above); still waiting for it",
            ", ".join(hosts),
        )
        return False
    log.info("failing over: serving without %s until it answers again (%s)", ", ".join(hosts), why)
    write_state(s.state_file, "failed_over", hosts=hosts, why=why)
    return True


def restart_hosts(
    s: LaunchSettings, args: list[str], stopping: threading.Event, away: Away
) -> bool:
    """The hosts again before a restart. A host that does not answer is waited for, for as long
    as the supervisor runs (the API's port says so meanwhile), or failed over after
    FAILOVER_AFTER seconds; any other problem ends the supervision: it would fail the same way
    again. False: do not restart."""
    rank0 = s.run.launch.rank0
    local_rank0 = rank0.is_file() and rank0.read_text().strip() == "127.0.0.1"
    conf = s.run.ssh_config
    away.hosts, tried_failover = [], False
    while not stopping.is_set():
        s.run.launch.problems.unlink(missing_ok=True)
        if hosts_up(s, args) == 0:
            return True
        found = read_state(s.run.launch.problems) or {"problems": [], "unreachable": []}
        # Macs whose Thunderbolt addresses were reset: back once set again
        lost = found.get("unaddressed", {})
        if not found["unreachable"] and not lost:
            log.info("not restarting: a host is not ready (above)")
            return False
        hosts = found["unreachable"] + [h for h in lost if h not in found["unreachable"]]

        def back(h):
            return is_back(conf, h, lost.get(h))

        why = next(
            (p for p in found["problems"] if any(h in p for h in hosts)), found["problems"][0]
        )
        log.info("waiting for %s to be back (tried every %d s): %s", ", ".join(hosts), POLL_S, why)
        t0 = time.monotonic()
        write_state(s.state_file, "waiting", hosts=hosts, why=why)
        with (
            DownServer(s.host, s.port, s.state_file, s.tls)
            if local_rank0
            else contextlib.nullcontext()
        ):
            wait_for(
                conf,
                hosts,
                why,
                stopping,
                lambda: (
                    s.failover_after
                    and not tried_failover
                    and time.monotonic() - t0 >= s.failover_after
                ),
                back=back,
            )
        if stopping.is_set():
            return False
        if s.failover_after and not tried_failover and not all(back(h) for h in hosts):
            tried_failover = True
            if fail_over(s, args, hosts, why):
                away.hosts, away.addresses = hosts, lost
                away.back.clear()
                return True
            continue
        log.info(
            "%s is back after %.0f s; restarting the ring", ", ".join(hosts), time.monotonic() - t0
        )
    return False


class Steady:
    """Whether a host is back for good: it answered every poll (`back`) for `steady_s` (a miss
    starts the run over), then computed a `probe` on its device (a failed one starts it over)."""

    def __init__(self, back, probe, steady_s: float = STEADY_S, clock=time.monotonic):
        self.back, self.probe, self.steady_s, self.clock = back, probe, steady_s, clock
        self.since: dict[str, float] = {}

    def __call__(self, host: str) -> bool:
        if not self.back(host):
            self.since.pop(host, None)
            return False
        now = self.clock()
        if now - self.since.setdefault(host, now) < self.steady_s:
            return False
        if self.probe(host):
            return True
        self.since.pop(host, None)
        return False


def computes(conf: Path, host: str) -> bool:
    """Whether `host` runs a small MLX computation on its default device, under the project's
    environment, within a minute."""
    try:
        p = ssh.run_on(
            conf,
            host,
            host == "127.0.0.1",
            '"$1" -c "$2"',
            (ssh.env_python(ROOT), PROBE),
            timeout=60,
        )
    except (subprocess.TimeoutExpired, ValueError):  # ValueError: ssh itself failed
        return False
    if "probe: ok" not in p.stdout:
        log.info("%s answers, but its probe did not compute: %s", host, p.stderr.strip()[-300:])
        return False
    return True


def watch_away(s: LaunchSettings, away: Away, stopping: threading.Event, take_back) -> None:
    """While the ring serves without `away.hosts`: once they are all back for good (`Steady`),
    `take_back()` (drain the ring, which then restarts with every host)."""
    conf = s.run.ssh_config
    steady = Steady(lambda h: is_back(conf, h, away.addresses.get(h)), lambda h: computes(conf, h))
    while not stopping.is_set() and not away.back.is_set():
        if away.hosts and all([steady(h) for h in away.hosts]):  # each host's run, every poll
            log.info(
                "%s answers again, %.0f s without a miss, and computes; taking it back (the ring "
                "restarts with every host)",
                ", ".join(away.hosts),
                STEADY_S,
            )
            away.back.set()
            take_back()
            return
        stopping.wait(POLL_S)
