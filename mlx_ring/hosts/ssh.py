"""ssh as the ring uses it: never asks for a password, gives up on a dead host within seconds, and
turns its failures into one sentence that names the host and what to do.

The options live in one generated ssh config file, read by our own calls and, through the `ssh` on
the launcher's PATH (bin/ssh), by mlx.launch's. The user's own ssh config is included first, so
their settings win; `RING_SSH_CONFIG` names another file to include (the tests' hosts).
"""

import shlex
import subprocess
from pathlib import Path

from mlx_ring.platform import local_network_hint

CONNECT_TIMEOUT = 5  # seconds; a host that never answers costs this, not ssh's ~2 minutes
BIN = Path(__file__).resolve().parent / "bin"  # put first on mlx.launch's PATH


def write_config(path: Path, user_config: str | None = None) -> Path:
    """The ring's ssh config at `path`: the user's (or `user_config`), then the ring's defaults."""
    include = (
        Path(user_config).expanduser().resolve() if user_config else Path.home() / ".ssh" / "config"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"Include {include}\n\nHost *\n"
        "  BatchMode yes\n"  # a password prompt would hang the launcher
        f"  ConnectTimeout {CONNECT_TIMEOUT}\n"
        # a host that drops off mid-run ends its rank's ssh in ~9-12 s
        "  ServerAliveInterval 3\n  ServerAliveCountMax 3\n  LogLevel ERROR\n"
    )
    return path


def env_python(root: Path | str) -> str:
    """The project's environment Python under checkout `root`: what runs Python on a host, never the
    system's `python3` (on a Mac without Xcode's command line tools, a stub that opens a dialog)."""
    return f"{root}/.venv/bin/python"


def argv(
    config: Path, host: str, command: str, args: tuple = (), via: str | None = None
) -> list[str]:
    """ssh argv running `command` (with `args` as $1...) in POSIX sh on `host` (macOS' login
    shell is zsh); `via`: connect to that address instead, as `host` otherwise (its user, key and
    known host key)."""
    route = ["-o", f"HostName={via}", "-o", f"HostKeyAlias={host}"] if via else []
    return [
        "ssh",
        "-F",
        str(config),
        *route,
        host,
        shlex.join(["sh", "-c", command, "sh", *map(str, args)]),
    ]


def reached_at(config: Path, host: str) -> str:
    """The address (or name) ssh connects to for `host`, as its config makes it (`ssh -G`)."""
    p = subprocess.run(
        ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, timeout=10
    )
    return next(
        (line.split(None, 1)[1] for line in p.stdout.splitlines() if line.startswith("hostname ")),
        host,
    )


def bulk_route(config: Path, host: str, ring_address: str, resolver) -> str | None:
    """The ring address when ssh would reach `host` some other way: bulk data (weights) then
    takes the ring's link (Thunderbolt, on Macs) rather than the route to the ssh name (often
    Wi-Fi). None: same link."""
    target = reached_at(config, host)
    try:
        return None if resolver(target) == ring_address else ring_address
    except ValueError:
        return ring_address


def explain(
    host: str, stderr: str, system: str | None = None, mac_version: str | None = None
) -> str:
    """ssh's failure as a sentence naming the host and what to do (`system`, `mac_version`: this
    machine's unless given, as platform.local_network_hint takes them)."""
    err = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    low = err.lower()
    if "connection refused" in low:
        todo = (
            "is sshd running there? (on a Mac: System Settings > General > Sharing > Remote Login)"
        )
    elif "timed out" in low or "no route" in low or "unreachable" in low:
        todo = (
            "is it on, awake and on this network? (a Mac asleep answers no ssh: wake it, and keep "
            "it awake with `sudo pmset -a sleep 0 womp 1 autorestart 1` there); "
            "check the name or address"
        )
        hint = local_network_hint(system, mac_version) if "no route" in low else None
        if hint:
            todo += f"; or {hint}"
    elif "permission denied" in low:
        todo = f"let this machine's key in: ssh-copy-id {host}"
    elif "resolve" in low or "not known" in low:
        todo = "check the name, or use its IP address in hosts.json"
    elif "host key verification" in low:
        todo = f"connect once by hand (ssh {host}) to accept its host key"
    else:
        todo = f"try `ssh {host}` by hand"
    return f"cannot reach {host} over ssh ({err}); {todo}"


class SshError(ValueError):
    pass


def run(
    config: Path,
    host: str,
    command: str,
    args: tuple = (),
    *,
    input: str = "",
    stdin=None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run `command` on `host` (`input`, or the open file `stdin`, as its stdin); SshError with a
    sentence if ssh itself failed (exit 255)."""
    feed = {"stdin": stdin} if stdin is not None else {"input": input.encode()}
    try:
        p = subprocess.run(
            argv(config, host, command, args), capture_output=True, timeout=timeout, **feed
        )
    except subprocess.TimeoutExpired:
        raise SshError(
            f"{host} did not finish a command within {timeout:.0f} s over ssh; is it overloaded, "
            "or its network very slow?"
        ) from None
    p.stdout, p.stderr = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode == 255:
        raise SshError(explain(host, p.stderr))
    return p


def run_on(
    conf: Path,
    host: str,
    local: bool,
    script: str,
    args: tuple = (),
    input: str = "",
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """`script` in sh with `args`, on this machine for a local rank, else over ssh."""
    if local:
        return subprocess.run(
            ["sh", "-c", script, "sh", *map(str, args)],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    return run(conf, host, script, args, input=input, timeout=timeout)
