"""The folders under the disk tier's root, one per scope, and who may delete them.

A scope's folder is `root/<scope>/`; its lock is `root/<scope>.lock`, flock'ed by the live tier
that owns the folder (the kernel drops the lock when that process ends, kill -9 included). A start
deletes the folders of other scopes only when no live tier holds them: two ranks on one machine
share one root, and neither may delete the other's blocks from under it. A scope longer than
FAMILY starts with its family (the model and format, cache/tiers.scope): a start never deletes a
scope of its own family, since the other ranks of the ring on this machine may not have claimed
theirs yet.
"""

import fcntl
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)
LOCK = ".lock"
DELETING = ".deleting-"  # a folder renamed away to be deleted: not a scope name (not hex)
TRIES = 10  # a tier deleting this scope holds its lock for a rename: retry briefly
RETRY_S = 0.05
FAMILY = 32  # hex digits of a scope's family


def claim(root: Path, scope: str) -> int | None:
    """The file descriptor holding `scope`'s lock, or None while another live tier holds it."""
    path = root / (scope + LOCK)
    for _ in range(TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _lock(fd):
            os.close(fd)
            time.sleep(RETRY_S)
        elif _same_file(fd, path):
            return fd
        else:
            os.close(fd)  # unlinked by a start deleting this scope: take the new file
    return None


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def delete_others(root: Path, scope: str) -> tuple[int, int]:
    """(files, bytes) deleted from the folders of scopes other than `scope` that no live tier
    holds; each folder is renamed away under its lock, then deleted without holding it."""
    entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False) or _is_lock(e)]
    files = size = 0
    for name in sorted({e.name.removesuffix(LOCK) for e in entries} - {scope}):
        if len(scope) > FAMILY and name[:FAMILY] == scope[:FAMILY]:
            continue  # another rank of this model on this machine, which may start later
        try:
            # one that a start killed while deleting it, or one another start is deleting now
            doomed = root / name if DELETING in name else _detach(root, name)
            if doomed is not None:
                n, b = remove_tree(doomed)
                files, size = files + n, size + b
        except OSError as e:
            log.warning(
                "prompt cache on disk: cannot delete %s (%s); left as it is", root / name, e
            )
    return files, size


def remove_tree(path: Path) -> tuple[int, int]:
    """Delete the folder `path` and return (files, bytes) it held; what vanishes meanwhile (another
    start deleting it too) is skipped."""
    files = size = 0
    for folder, dirs, names in os.walk(path, topdown=False):
        for name in names:
            file = os.path.join(folder, name)
            try:
                n = os.lstat(file).st_size
                os.unlink(file)
                files, size = files + 1, size + n
            except FileNotFoundError:
                pass
        for name in dirs:
            sub = os.path.join(folder, name)
            os.unlink(sub) if os.path.islink(sub) else _rmdir(sub)
    _rmdir(path)
    return files, size


def _rmdir(path) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def _detach(root: Path, name: str) -> Path | None:
    """Rename scope `name`'s folder out of the way (None when a live tier holds it, or it has no
    folder) and remove its lock file."""
    lock = root / (name + LOCK)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _lock(fd) or not _same_file(fd, lock):
            return None
        folder, doomed = root / name, None
        if folder.is_dir():
            # not a scope name (not hex), so no tier claims it while it is being deleted
            doomed = root / f"{name}{DELETING}{os.getpid()}-{time.time_ns()}"
            os.rename(folder, doomed)
        lock.unlink()
        return doomed
    finally:
        os.close(fd)


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _is_lock(entry: os.DirEntry) -> bool:
    return entry.name.endswith(LOCK) and entry.is_file(follow_symlinks=False)
