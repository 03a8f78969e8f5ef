"""Test hosts that behave like separate machines, on one Linux box (root needed).

Each host is a network namespace with its own address on a shared bridge, its own hostname, and a
real sshd (key login with a key made here) running in a mount namespace where the project's path
and the home directory are folders of that host's own: a host starts empty, as a new Mac does, and
the launcher must provision it. uv's download cache is shared with the hosts, as a LAN package
mirror would be: the namespaces have no internet, and uv still builds each host's own environment.
"""

import itertools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def why_not() -> str | None:
    """None if this machine can make the test hosts, else a sentence saying why it cannot."""
    if os.geteuid() != 0:
        return (
            "the multi-host tests make network namespaces and bind mounts, which needs "
            "root (CI runs as root)"
        )
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"the multi-host tests need `{tool}` (iproute2, util-linux, openssh-client)"
    if not Path("/usr/sbin/sshd").exists():
        apt = subprocess.run(
            (
                "apt-get install -y -qq openssh-server || (apt-get update -qq && apt-get install "
                "-y -qq openssh-server)"
            ),
            shell=True,
            capture_output=True,
            text=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        if apt.returncode or not Path("/usr/sbin/sshd").exists():
            return (
                "sshd is missing and apt could not install openssh-server: "
                f"{apt.stderr.strip()[-200:]}"
            )
    probe = subprocess.run(
        ["ip", "netns", "add", f"mrprobe{os.getpid()}"], capture_output=True, text=True
    )
    if probe.returncode:
        return f"this machine cannot make network namespaces ({probe.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", f"mrprobe{os.getpid()}"], capture_output=True)
    return None


def sh(cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    if check and p.returncode:
        raise RuntimeError(f"`{cmd}` failed: {p.stderr.strip()}")
    return p


@dataclass
class NetnsHost:
    name: str  # its ssh name and its hostname
    address: str
    netns: str
    veth: str  # the bridge side of its link
    folder: Path  # its home/ and project/ live here
    sshd: subprocess.Popen | None = None

    def entry(self, **keys) -> dict:
        """Its hosts.json entry, named as a user names a Mac."""
        return {"ssh": self.name, "ips": [self.address], **keys}


SERIAL = itertools.count()


class NetnsHosts:
    """`n` hosts on a bridge; `close()` removes everything, whatever state the tests left."""

    def __init__(self, n: int, tmp: Path):
        # Names and addresses of their own for each set (several may live in one test process).
        serial = next(SERIAL)
        tag = f"{os.getpid() % 10000}{serial}"
        self.tmp, self.bridge = Path(tmp), f"mrb{tag}"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.net = f"10.{200 + (os.getpid() + serial) % 50}.{(os.getpid() + 7 * serial) % 250}"
        self.gateway = f"{self.net}.1"
        self.hosts: list[NetnsHost] = []
        self.ssh_config = self.tmp / "ssh_config"
        self.key = self.tmp / "client_key"
        self.uv_cache = Path(sh("uv cache dir 2>/dev/null || echo $HOME/.cache/uv").stdout.strip())
        try:
            self._up(n, tag)
        except BaseException:
            self.close()
            raise

    def _up(self, n: int, tag: str) -> None:
        sh(
            (
                f"ip link add {self.bridge} type bridge && ip addr add {self.gateway}/24 dev "
                f"{self.bridge} && ip link set {self.bridge} up"
            )
        )
        sh(
            (
                f"ssh-keygen -q -t ed25519 -N '' -f {self.key} && ssh-keygen -q -t ed25519 -N '' "
                f"-f {self.tmp}/host_key"
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)
        config = []
        for i in range(n):
            h = NetnsHost(
                f"ringhost-{chr(97 + i)}",
                f"{self.net}.{11 + i}",
                f"mr{tag}h{i}",
                f"mrv{tag}h{i}",
                self.tmp / f"host{i}",
            )
            self.hosts.append(h)
            sh(
                f"ip netns add {h.netns} && ip link add {h.veth} type veth peer name eth0 netns "
                f"{h.netns} && ip link set {h.veth} master {self.bridge} up && ip -n {h.netns} "
                f"addr add {h.address}/24 dev eth0 && ip -n {h.netns} link set eth0 up && ip -n "
                f"{h.netns} link set lo up"
            )
            config.append(
                f"Host {h.name}\n  HostName {h.address}\n  User root\n  IdentityFile {self.key}\n"
                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            )
            self.wipe(h)
        # A name for a machine that is off: its address answers nothing, not even a refusal.
        config.append(
            f"Host ringhost-off\n  HostName {self.net}.99\n  User root\n  IdentityFile {self.key}\n"
        )
        self.ssh_config.write_text("\n".join(config))
        for h in self.hosts:
            self.start_sshd(h)

    def wipe(self, h: NetnsHost) -> None:
        """The host as a new machine: an empty home and no project."""
        self.stop_sshd(h)
        if h.folder.exists():
            shutil.rmtree(h.folder)
        (h.folder / "home" / ".cache" / "uv").mkdir(parents=True)
        (h.folder / "project").mkdir()

    def start_sshd(self, h: NetnsHost) -> None:
        cfg = h.folder / "sshd_config"
        cfg.write_text(
            f"ListenAddress {h.address}\nHostKey {self.tmp}/host_key\nAuthorizedKeysFile "
            f"{self.key}.pub\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nUseDNS "
            f"no\nMaxStartups 100\nPidFile {h.folder}/sshd.pid\n"
        )
        home = Path.home()
        mounts = (
            f"hostname {h.name} && mount --bind {self.uv_cache} {h.folder}/home/.cache/uv && "
            f"mount --rbind {h.folder}/home {home} && mkdir -p {ROOT} && mount --bind "
            f"{h.folder}/project {ROOT}"
        )
        h.sshd = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                h.netns,
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"{mounts} && exec /usr/sbin/sshd -D -e -f {cfg}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(h.folder / "sshd.log", "a"),
        )
        for _ in range(100):
            if self.ssh(h, "true", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"sshd on {h.name} did not come up: {(h.folder / 'sshd.log').read_text()[-500:]}"
        )

    def stop_sshd(self, h: NetnsHost) -> None:
        """Stop its sshd and everything running on the host (sshd down: 'connection refused')."""
        if h.sshd is not None:
            h.sshd.kill()
            h.sshd.wait()
            h.sshd = None
        self.kill_all(h)

    def kill_all(self, h: NetnsHost) -> None:
        for pid in self.pids(h):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pids(self, h: NetnsHost, but_sshd: bool = False) -> list[int]:
        """Processes running in the host's network namespace (its sshd's own left out if asked)."""
        out = sh(f"ip netns pids {h.netns}", check=False).stdout.split()
        keep = {h.sshd.pid} if but_sshd and h.sshd else set()
        # ip netns exec, unshare and sh exec into sshd: one pid
        return [int(p) for p in out if int(p) not in keep]

    def ssh(self, h: NetnsHost, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [
                "ssh",
                "-F",
                str(self.ssh_config),
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=3",
                "-o",
                "LogLevel=ERROR",
                h.name,
                cmd,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and p.returncode:
            raise RuntimeError(f"ssh {h.name} {cmd!r} failed: {p.stderr.strip()}")
        return p

    def shape(self, rate: str | None) -> None:
        """Every host's link limited to `rate` (e.g. "1gbit") both ways with tbf; None lifts it."""
        for h in self.hosts:
            for dev, ns in ((h.veth, ""), ("eth0", f"-n {h.netns} ")):
                sh(f"tc {ns}qdisc del dev {dev} root", check=False)
                if rate:
                    sh(f"tc {ns}qdisc add dev {dev} root tbf rate {rate} burst 1mb latency 50ms")

    def close(self) -> None:
        for h in self.hosts:
            self.stop_sshd(h)
            sh(f"ip netns del {h.netns}", check=False)
        sh(f"ip link del {self.bridge}", check=False)
