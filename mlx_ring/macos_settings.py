"""The macOS settings a ring host depends on, beside platform.py's system readers: the Application
Firewall (global state, block-all, stealth mode, whether the environment's Python may accept
connections), power (pmset: sleep, wake for network access, start after a power failure) and RDMA
over Thunderbolt (ibv_devices, ibv_devinfo: the devices JACCL uses, and how to turn them on), each
a pure parser over the command's output (tested on recorded outputs, tests/data/macos/) and the
advice a user acts on."""

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mlx_ring.platform import _run

SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"


# --- macOS Application Firewall ---------------------------------------------------------------


def parse_firewall(text: str) -> bool | None:
    """Whether `socketfilterfw --getglobalstate` says the firewall is on (state 1, or 2: block all);
    None for output it does not recognise (a managed Mac's refusal, nothing)."""
    m = re.search(r"\(State = (\d+)\)", text)
    if m:
        return m.group(1) != "0"
    low = text.lower()
    if "is disabled" in low:
        return False
    if "is enabled" in low or "block" in low:
        return True
    return None


def parse_switch(text: str) -> bool | None:
    """On or off from `socketfilterfw --getblockall` or `--getstealthmode` ("... set to enabled.",
    "... is on", older "Block all DISABLED!"); None for anything else (a managed Mac's refusal)."""
    low = text.strip().lower()
    if re.search(r"set to enabled|mode is on|enabled!|mode enabled", low):
        return True
    if re.search(r"set to disabled|mode is off|disabled!|mode disabled", low):
        return False
    return None


def parse_app_allowed(text: str) -> bool | None:
    """Whether `socketfilterfw --getappblocked PATH` lets that program accept incoming connections:
    False when it is blocked or not in the firewall's list at all (then macOS would ask in a dialog,
    which nobody sees over ssh); None for output it does not recognise."""
    low = text.strip().lower()
    if "not part of the firewall" in low:
        return False
    if "not blocked" in low or "permitted" in low:
        return True
    if "blocked" in low:
        return False
    return None


@dataclass
class Firewall:
    """A Mac's Application Firewall as `socketfilterfw` reports it; None where it did not say."""

    on: bool | None = None
    block_all: bool | None = None
    stealth: bool | None = None
    app_allowed: bool | None = None  # the environment's Python may accept incoming connections


def firewall_enabled() -> bool | None:
    """This Mac's Application Firewall: on, off, or None (not a Mac, or unreadable)."""
    if not Path(SOCKETFILTERFW).exists():
        return None
    try:
        return parse_firewall(_run([SOCKETFILTERFW, "--getglobalstate"]))
    except (OSError, subprocess.CalledProcessError):
        return None


def allow_line(python: str) -> str:
    """The command that lets `python` accept incoming connections through
    the Application Firewall."""
    return f"sudo {SOCKETFILTERFW} --add {python} --unblockapp {python}"


def firewall_advice(enabled: bool | None, python: str) -> str | None:
    """The sentence that tells how to let the environment's `python` accept the ring's connections
    through a Mac's Application Firewall (which drops them silently for an unsigned Python; nobody
    sees its prompt over ssh); None when the firewall is off or unknown (Linux)."""
    if not enabled:
        return None
    return (
        "the macOS Application Firewall is on and will silently drop the ring's connections to "
        f"{python}; allow it there: {allow_line(python)} (if it blocks all incoming connections, "
        "also turn that off in System Settings > Network > Firewall)"
    )


def firewall_blocks(fw: Firewall, python: str) -> str | None:
    """Why the firewall certainly drops the ring's connections to `python`, with the lines that let
    them in; None where it lets them in, is off, or did not say (then `firewall_advice` warns)."""
    if not fw.on:
        return None
    if fw.block_all:
        return (
            "the macOS Application Firewall blocks all incoming connections, the ring's too; turn "
            f"that off (System Settings > Network > Firewall > Options, or sudo {SOCKETFILTERFW} "
            f"--setblockall off), then allow the environment's Python: {allow_line(python)}"
        )
    if fw.app_allowed is False:
        return (
            f"the macOS Application Firewall does not let {python} accept "
            "incoming connections, so it drops the ring's (silently: nobody "
            "sees its prompt over ssh); allow it there: " + allow_line(python)
        )
    return None


def stealth_note(fw: Firewall) -> str | None:
    """What stealth mode changes for the ring: nothing it allows is blocked, but a connection that
    comes before its neighbour listens gets no refusal, so it waits out TCP's retries."""
    if not (fw.on and fw.stealth):
        return None
    return (
        "the macOS Application Firewall is in stealth mode: the ring still connects, but a rank "
        "that starts before its neighbour listens gets no answer and waits out TCP's retries, so "
        "starting takes longer"
    )


# --- power: a Mac asleep does not answer ssh -------------------------------------------------


def parse_pmset(text: str) -> dict[str, str]:
    """`pmset -g`'s settings by name, each its value's first word ("(sleep prevented by ...)" notes
    dropped). Names may hold spaces ("Sleep On Power Button")."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s+([A-Za-z][A-Za-z ]*?)\s+(\S+)(\s+\(.*\))?\s*$", line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def power_advice(settings: dict[str, str]) -> str | None:
    """What in a Mac's `pmset -g` settings can take it away from the ring (idle sleep: a
    sleeping Mac answers no ssh; staying off after a power failure; no wake for network access),
    with the command and the System Settings switches that fix it; None when nothing does, or
    nothing was read (Linux)."""
    said, fix = [], []
    sleep = settings.get("sleep")
    if sleep not in (None, "0") and settings.get("SleepDisabled") != "1":
        said.append(
            f"it goes to sleep after {sleep} idle minute(s) (pmset sleep {sleep}), and a Mac "
            "asleep answers no ssh"
        )
        fix.append("sleep 0")
    if settings.get("womp") == "0":
        said.append("it does not wake for network access (womp 0)")
        fix.append("womp 1")
    if settings.get("autorestart") == "0":  # absent on a laptop, which has a battery
        said.append("it stays off after a power failure (autorestart 0)")
        fix.append("autorestart 1")
    if not said:
        return None
    return (
        f"{'; '.join(said)}; run there: sudo pmset -a {' '.join(fix)} (or System Settings > "
        "Energy, Energy Saver before macOS 15, Battery > Options on a laptop: 'Prevent automatic "
        "sleeping when the display is off', 'Wake for network access', 'Start up automatically "
        "after a power failure')"
    )


# --- RDMA over Thunderbolt (JACCL) --------------------------------------------------------------

# the first macOS with RDMA over Thunderbolt (Apple's TN3205), on Thunderbolt 5 ports
RDMA_MACOS = (26, 2)
RDMA_ENABLE = (
    "turn RDMA over Thunderbolt on once in macOS Recovery (hold the power button while it starts, "
    "Options, then Utilities > Terminal), run `rdma_ctl enable` there and restart; `ibv_devices` "
    "then lists its rdma_en* devices"
)


def parse_ibv_devices(text: str) -> list[str]:
    """The device names `ibv_devices` lists (the first column below its `------` rule)."""
    lines = text.splitlines()
    start = next(
        (i + 1 for i, line in enumerate(lines) if line.strip().startswith("------")), len(lines)
    )
    return [line.split()[0] for line in lines[start:] if line.split()]


def parse_ibv_devinfo(text: str) -> dict[str, str]:
    """Each device `ibv_devinfo` shows (its `hca_id`) and its port's state
    (PORT_ACTIVE, PORT_DOWN, ...)."""
    states, device = {}, None
    for line in text.splitlines():
        if m := re.match(r"\s*hca_id:\s*(\S+)", line):
            device = m.group(1)
            states.setdefault(device, "")
        elif (m := re.match(r"\s*state:\s*(\S+)", line)) and device and not states[device]:
            states[device] = m.group(1)
    return states


def parse_macos_version(text: str) -> tuple[int, ...]:
    """`sw_vers -productVersion` as numbers ("26.2" -> (26, 2)); () if it says nothing readable."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def rdma_devices(devices_out: str, devinfo_out: str) -> dict[str, str]:
    """Device -> its port's state ("" where `ibv_devinfo` did not say),
    from both commands' outputs."""
    states = parse_ibv_devinfo(devinfo_out)
    return {
        d: states.get(d, "")
        for d in [*parse_ibv_devices(devices_out), *states]
        if d.startswith("rdma_")
    }


def rdma_advice(version: tuple[int, ...], devices: dict[str, str]) -> str | None:
    """What a Mac without RDMA devices needs for JACCL (None where it has some)."""
    if devices:
        return None
    if version and version < RDMA_MACOS:
        return (
            "it has no RDMA devices: RDMA over Thunderbolt needs macOS "
            f"{'.'.join(map(str, RDMA_MACOS))} or later (it runs {'.'.join(map(str, version))}) "
            f"and Thunderbolt 5 ports; after updating, {RDMA_ENABLE}"
        )
    return (
        "it has no RDMA devices (`ibv_devices` lists none): on a Mac with Thunderbolt 5 "
        f"ports, {RDMA_ENABLE}"
    )


def format_rdma(devices: dict[str, str]) -> str:
    """A Mac's RDMA devices for the `check` table: names, each port that is not active marked."""
    return (
        ", ".join(
            d + ("" if s in ("PORT_ACTIVE", "") else f" ({s.removeprefix('PORT_').lower()})")
            for d, s in devices.items()
        )
        or "none"
    )
