"""mlx.launch leaves two temporary files per rank on its host at every start: the ring's hostfile
(MLX_HOSTFILE) and the pid file it reads to stop the rank. A rank removes the hostfile once MLX has
read it and notes its pid file; once the rank is gone, the launcher's sweep (after every run, on every
host) or the next rank on that host removes it. A rank's own exit cannot: mlx.launch may still run its
stop script, which fails on a missing pid file."""

import os
import sys
import tempfile
from pathlib import Path


def own_files(pid: int | None = None, hostfile: str | None = None) -> list[Path]:
    """This rank's files from mlx.launch: the hostfile, and the temporary file holding just its pid."""
    pid = pid or os.getpid()
    hostfile = hostfile if hostfile is not None else os.environ.get("MLX_HOSTFILE", "")
    folder = Path(hostfile).parent if hostfile else Path(tempfile.gettempdir())
    found = [Path(hostfile)] if hostfile and Path(hostfile).is_file() else []
    for p in folder.glob("tmp.*"):  # mktemp's names; the pid file is the one that holds our pid alone
        try:
            if p.is_file() and p.stat().st_size < 16 and p.read_text().strip() == str(pid):
                found.append(p)
        except OSError:
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def sweep(notes: Path) -> list[Path]:
    """Remove the files noted in `notes` (a folder, one note per rank's pid) by ranks that are gone."""
    removed = []
    for note in notes.iterdir() if notes.is_dir() else ():
        if note.name.isdigit() and not _alive(int(note.name)):
            for name in [*note.read_text().splitlines(), str(note)]:
                if name and Path(name).exists():
                    Path(name).unlink(missing_ok=True)
                    removed.append(Path(name))
    return removed


def tidy(notes: Path) -> None:
    """At a rank's start, after MLX has read its hostfile: sweep what gone ranks left, remove the
    hostfile, and note the pid file for the sweep after this rank."""
    notes.mkdir(parents=True, exist_ok=True)
    sweep(notes)
    files = own_files()
    for p in files:
        if str(p) == os.environ.get("MLX_HOSTFILE"):
            p.unlink(missing_ok=True)  # read once, at init
    (notes / str(os.getpid())).write_text("".join(f"{p}\n" for p in files))


if __name__ == "__main__":  # the launcher's sweep on a host: python -m mlx_ring.ring.leftovers NOTES
    sweep(Path(sys.argv[1]))
