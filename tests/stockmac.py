"""A stock Mac's userland on this Linux box, for running the launcher as a Mac would: a PATH
holding only the commands a fresh macOS has (tests/data/macos/stock-commands.txt), with a real
bash 3.2 as `bash` and `sh` (macOS's /bin/sh is bash 3.2 in POSIX mode), and recording stubs for
the commands a stock Mac has only as "install Xcode's tools" stubs (python3, git), which the
launcher must not run."""

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# built from GNU bash 3.2's source (shared/mac/README.md)
BASH_32 = ROOT.parent / "shared" / "mac" / "bash-3.2"
LIST = ROOT / "tests" / "data" / "macos" / "stock-commands.txt"


def stock_commands() -> tuple[list[str], list[str]]:
    """(commands, stubs) of a fresh macOS."""
    lines = [
        x.strip() for x in LIST.read_text().splitlines() if x.strip() and not x.startswith("#")
    ]
    cut = lines.index("stubs:")
    return lines[:cut], lines[cut + 1 :]


def stock_path(folder: Path, shell: Path = BASH_32, extra: dict[str, str] | None = None) -> str:
    """A PATH of one folder: this machine's binaries for the stock commands it has, `shell` as
    bash and sh, a stub for each Xcode stub (it writes its name to folder/stub-called and fails),
    and `extra` (name -> script text) for what a test must stand in for."""
    folder.mkdir(parents=True, exist_ok=True)
    commands, stubs = stock_commands()
    for name in commands:
        found = shutil.which(name)
        if found and name not in ("bash", "sh"):
            (folder / name).symlink_to(found)
    for name in ("bash", "sh"):
        (folder / name).symlink_to(shell)
    for name in stubs:
        stub = folder / name
        stub.write_text(
            f"#!/bin/sh\necho {name} >> '{folder}/stub-called'\necho 'xcode-select: note: no "
            "developer tools were found, requesting install.' >&2\nexit 1\n"
        )
        stub.chmod(0o755)
    for name, text in (extra or {}).items():
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return str(folder)


def stubs_called(folder: Path) -> list[str]:
    f = folder / "stub-called"
    return f.read_text().split() if f.exists() else []
