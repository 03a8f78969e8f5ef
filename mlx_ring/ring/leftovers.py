"""mlx.launch leaves two temporary files per rank on its host at every start: the ring's hostfile
(MLX_HOSTFILE; JACCL's devices file, MLX_IBV_DEVICES) and the pid file it reads to stop the rank.
A rank notes both as it starts and removes the hostfile once MLX has read it; once the rank is
gone, the launcher's sweep (after every run, on every host) or the next rank on that host removes
what is left. A rank's own exit cannot: mlx.launch may still run its stop script, which fails on
a missing pid file."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlx_ring import settings


def own_files(pid: int | None = None, hostfile: str | None = None) -> list[Path]:
    """This rank's files from mlx.launch: the hostfile, and the temporary file
    holding just its pid."""
    pid = pid or os.getpid()
    hostfile = hostfile if hostfile is not None else _launch_file()
    folder = Path(hostfile).parent if hostfile else Path(tempfile.gettempdir())
    found = [Path(hostfile)] if hostfile and Path(hostfile).is_file() else []
    # mktemp's names; the pid file is the one that holds our pid alone
    for p in folder.glob("tmp.*"):
        try:
            if p.is_file() and p.stat().st_size < 16 and p.read_text().strip() == str(pid):
                found.append(p)
        except OSError:
            pass
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True
    ).stdout.strip()
    return bool(stat) and not stat.startswith("Z")


def _rank(pid: int) -> bool:
    """Whether `pid` is still one of our ranks (a noted pid may have been
    reused by another program)."""
    p = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True)
    return "server.py" in p.stdout


def sweep(notes: Path, wait: float = 0.0, kill: bool = False) -> list[Path]:
    """Remove the files noted in `notes` (a folder, one note per rank's pid) by ranks that are
    gone; `wait`: seconds to give ranks that are exiting right now. `kill`: before a new ring
    starts, a noted rank still running is a stale one (its host was cut off while the ring moved
    on, and nothing told it): it is killed, freeing its port and its slice's memory."""
    deadline, removed = time.monotonic() + wait, []
    for note in sorted(notes.iterdir()) if notes.is_dir() else ():
        if not note.name.isdigit():
            continue
        pid = int(note.name)
        if kill and _alive(pid) and _rank(pid):
            os.kill(pid, signal.SIGKILL)
            deadline = max(deadline, time.monotonic() + 2)
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _alive(pid):
            for name in [*note.read_text().splitlines(), str(note)]:
                if name and Path(name).exists():
                    Path(name).unlink(missing_ok=True)
                    removed.append(Path(name))
    return removed


def note(notes: Path) -> None:
    """At a rank's start, before MLX reads its hostfile: sweep what gone ranks left, and note
    this rank's files, so the sweep after it removes them even if it dies while it starts."""
    notes.mkdir(parents=True, exist_ok=True)
    sweep(notes)
    (notes / str(os.getpid())).write_text("".join(f"{p}\n" for p in own_files()))


def _launch_file() -> str:
    return settings.text("MLX_HOSTFILE") or settings.text("MLX_IBV_DEVICES") or ""


def drop_hostfile() -> None:
    """Once MLX has read it (at init), the ring's hostfile (or JACCL's devices file) is
    of no more use."""
    if _launch_file():
        Path(_launch_file()).unlink(missing_ok=True)


# the launcher's sweep on a host: python -m mlx_ring.ring.leftovers NOTES [--kill]
if __name__ == "__main__":
    sweep(Path(sys.argv[1]), wait=5, kill="--kill" in sys.argv[2:])
