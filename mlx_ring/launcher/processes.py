"""The launcher's processes, the same on macOS and Linux: the environment's Python, a pid file
read, whether a pid lives, and a process group killed."""

import os
import signal
import sys
from pathlib import Path

PYTHON = sys.executable  # the environment's Python, whatever the system's python3 is


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


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
