"""Where Linux and macOS differ for the prompt cache's disk: the folder its blocks live in, keeping
that folder out of backups, and the limit on the files a process may hold open. The other
differences are in platform.py.
"""

import logging
import platform
import resource
import subprocess
from pathlib import Path

from mlx_ring.platform import _run

log = logging.getLogger(__name__)


def prompt_cache_folder(
    system: str | None = None, home: Path | None = None, *, cache_dir: Path
) -> Path:
    """Where a rank keeps its prompt-cache blocks: on macOS in a `.noindex` folder under
    ~/Library/Caches (Spotlight skips those, so it does not index every block written); elsewhere
    under `cache_dir` (CACHE_DIR). `system` and `home` default to this machine's."""
    if (system or platform.system()) == "Darwin":
        return (home or Path.home()) / "Library/Caches/mlx-ring.noindex/prompt-blocks"
    return Path(cache_dir) / "prompt-blocks"


def exclude_from_backups(path: Path, system: str | None = None) -> None:
    """On macOS, keep Time Machine from backing up the existing folder `path` (`tmutil
    addexclusion`: a sticky exclusion that follows the folder and needs no root); nothing
    elsewhere. A failure is logged, never raised: the cache works without it."""
    if (system or platform.system()) != "Darwin":
        return
    try:
        _run(["tmutil", "addexclusion", str(path)])
    except (OSError, subprocess.SubprocessError) as e:
        detail = (getattr(e, "stderr", None) or str(e)).strip()
        log.warning("could not exclude %s from Time Machine's backups: %s", path, detail)


def raise_open_files(want: int = 4096) -> int:
    """Raise this process's soft limit on open files toward `want`, as far as the hard limit
    allows; returns the soft limit now. macOS starts processes at a low soft limit, and its hard
    limit can read as unlimited while the kernel refuses more than kern.maxfilesperproc: a value
    refused is halved until one is taken."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    while target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            target //= 2
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
