"""The prompt cache's disk tier: one rank's blocks (its own layers' KV, as bytes) on its own disk,
so they outlive restarts. Never MLX: the engine thread turns arrays into records (bytes, or
read-only views of evaluated arrays' memory) and back, and records it put come back to that thread
to be let go (`put` and `close` drop those the writer is done with).

Layout: `root/<scope>/<first two hex>/<32 hex>.kv`, one file per block, named by its 16-byte chain
key in lower case (macOS's file system ignores case). `scope` is the caller's hex digest of what
made the KV (model, format, this rank's layers); `root/<scope>/FORMAT` holds the FORMAT that wrote
the folder, and `root/<scope>.lock` is flock'ed while a tier owns the folder (scopes.py).

File: a fixed prefix (magic, header length, the header's checksum), a JSON header (format, full
key, scope, each array's name, dtype, shape, offset and length, the payload's blake2b checksum),
then the payload (blockfile.py). `get` checks all of it: a file that fails is deleted, counted, and
reads as a miss.

Start: leftover temporary files are deleted, and so are the folders of other scopes (unless a live
tier holds them: two ranks may share a machine) and a folder of another FORMAT; then the least
recently used files go until the folder fits `cap_bytes`, and the keys held are read into memory,
so `has` never touches the disk. A file's mtime is its last use (`get` touches what it reads).

Writes: `put` only queues (bounded by `queue_bytes`, which the layer plan counts as memory); one
writer thread writes each block once, to a temporary file in its folder that `os.replace` puts in
place. No fsync: it is slow on Apple's SSDs, and the checksums already keep a torn file from
loading, so a kill -9 or a power cut loses blocks, never correctness. The writer deletes least
recently used files to stay under `cap_bytes`, skips blocks while the file system's free space is
below `floor_bytes` (Time Machine's local snapshots keep deleted blocks on the disk for a while),
and stops writing at its first OSError (a full or read-only disk), logged once; nothing it meets
raises, and serving goes on from what is held.

Reads: whole files into bytes on a few threads (no file stays open: macOS allows few per
process by default), returned in the order asked; a block still queued is served from the queue.
"""

import logging
import os
import re
import shutil
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlx_ring.cache import blockfile, scopes
from mlx_ring.cache.blockfile import FORMAT, Record
from mlx_ring.cache_sizes import WRITE_QUEUE_BYTES

__all__ = ["FORMAT", "DiskTier", "Record"]

log = logging.getLogger(__name__)
KEY_BYTES = 16
SCOPE = re.compile(r"[0-9a-f]{1,128}")
BLOCK_NAME = re.compile(r"[0-9a-f]{32}\.kv")
SHARD = re.compile(r"[0-9a-f]{2}")
TEMP = ".tmp"
READERS = 4  # a run of blocks reads in parallel; few enough to leave the engine its cores
MIN_FLOOR = 20 << 30
FLOOR_SHARE = 0.10
COUNTERS = ("written_bytes", "read_bytes", "hits", "misses", "corrupt", "skipped")


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"a block key is {KEY_BYTES} bytes (its chain key); got {key!r:.60}")


class DiskTier:
    """One rank's prompt-cache blocks under `root/scope`; see the module's docstring."""

    def __init__(
        self,
        root: Path,
        scope: str,
        cap_bytes: int,
        floor_bytes: int | None = None,
        queue_bytes: int = WRITE_QUEUE_BYTES,
    ):
        if not isinstance(scope, str) or not SCOPE.fullmatch(scope):
            raise ValueError(
                f"scope {scope!r:.80} is not lowercase hex of 1 to 128 digits; pass a digest's "
                "hexdigest()"
            )
        if cap_bytes < 0 or queue_bytes < 0 or (floor_bytes is not None and floor_bytes < 0):
            raise ValueError("cap_bytes, floor_bytes and queue_bytes are sizes; pass 0 or more")
        self.root, self.scope, self.dir = Path(root), scope, Path(root) / scope
        self.cap, self.queue_cap, self.floor = int(cap_bytes), int(queue_bytes), floor_bytes
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file size, least recent first
        self._queue: OrderedDict[bytes, Record] = OrderedDict()  # until its file is in place
        # written or dropped, until the engine thread's next call lets them go: a record may view
        # MLX's arrays, and only that thread frees them
        self._done: list[Record] = []
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._bytes = self._queued = 0
        self._stopped: str | None = None  # why writes stopped, once they have
        self._low = False  # the last write found free space below the floor
        self._closing = self._abandon = False
        self._lock_fd: int | None = None
        try:
            self._start()
        except OSError as e:
            log.warning("prompt cache on disk: %s unusable (%s); serving without it", self.dir, e)
            self._stopped, self._index, self._bytes = str(e), OrderedDict(), 0
            scopes.release(self._lock_fd)
            self._lock_fd = None
        self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="disk-read")
        self._writer = threading.Thread(target=self._write_loop, name="disk-writer", daemon=True)
        if self._lock_fd is not None:
            self._writer.start()

    # --- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.floor is None:
            self.floor = max(MIN_FLOOR, int(FLOOR_SHARE * shutil.disk_usage(self.root).total))
        self._lock_fd = scopes.claim(self.root, self.scope)
        if self._lock_fd is None:
            self._stopped = "another running process owns this folder"
            log.warning("prompt cache on disk: %s is another process's; reading only", self.dir)
            self._scan(clean=False)
            return
        files, size = scopes.delete_others(self.root, self.scope)
        stamp = self.dir / "FORMAT"
        if self.dir.is_dir() and _read_text(stamp) != str(FORMAT):
            n, b = scopes.remove_tree(self.dir)
            files, size = files + n, size + b
        self.dir.mkdir(exist_ok=True)
        if not stamp.exists():
            stamp.write_text(str(FORMAT))
        temp, temp_size = self._scan(clean=True)
        with self._lock:
            over = self._evict(self.cap)
        for path in over:
            _unlink(path)
        if files or temp or over:
            log.info(
                "prompt cache on disk: deleted %d files (%d bytes) of other scopes or formats, "
                "%d temporary files (%d bytes), %d least recently used blocks over the cap",
                files,
                size,
                temp,
                temp_size,
                len(over),
            )
        with self._lock:
            held = (len(self._index), self._bytes)
        log.info("prompt cache on disk: %d blocks (%d bytes) in %s", *held, self.dir)

    def _scan(self, clean: bool) -> tuple[int, int]:
        """Index the blocks held, least recently used first; delete temporary files when `clean`.
        Returns (temporary files, bytes) deleted."""
        found, temp, temp_size = [], 0, 0
        for shard in os.scandir(self.dir):
            if not (SHARD.fullmatch(shard.name) and shard.is_dir(follow_symlinks=False)):
                continue
            for entry in os.scandir(shard.path):
                try:
                    if entry.name.endswith(TEMP) and clean:
                        n = entry.stat().st_size
                        os.unlink(entry.path)
                        temp, temp_size = temp + 1, temp_size + n
                    elif BLOCK_NAME.fullmatch(entry.name) and entry.name[:2] == shard.name:
                        st = entry.stat(follow_symlinks=False)
                        found.append((st.st_mtime_ns, entry.name, st.st_size))
                except FileNotFoundError:
                    pass  # gone meanwhile (its owner evicted it)
        with self._lock:
            for _, name, size in sorted(found):
                self._index[bytes.fromhex(name[:32])] = size
                self._bytes += size
        return temp, temp_size

    def _evict(self, room: int) -> list[Path]:
        """Drop least recently used blocks from the index until the held bytes fit `room`; the
        caller deletes the files returned, outside the lock."""
        gone = []
        while self._index and self._bytes > room:
            key, size = self._index.popitem(last=False)
            self._bytes -= size
            gone.append(self._path(key))
        return gone

    def _path(self, key: bytes) -> Path:
        name = key.hex()
        return self.dir / name[:2] / f"{name}.kv"

    # --- the engine thread's calls -------------------------------------------------------------

    def has(self, key: bytes) -> bool:
        """Whether the block is on disk or queued for the writer (from memory; a file found
        corrupt later reads as a miss)."""
        _check_key(key)
        with self._lock:
            return key in self._index or key in self._queue

    def put(self, key: bytes, record: Record) -> bool:
        """Queue the block for writing; False when it is held or queued already, or skipped
        (writes stopped, the queue full, or the block larger than the cap)."""
        _check_key(key)
        self._let_go()
        size = record.nbytes()
        with self._lock:
            if key in self._index or key in self._queue:
                return False
            full = self._queued + size > self.queue_cap or size > self.cap
            if self._stopped or self._closing or full:
                self._counts["skipped"] += 1
                return False
            self._queue[key] = record
            self._queued += size
            self._wake.notify()
        return True

    def get(self, keys: list[bytes]) -> list[Record | None]:
        """Each block's record, in the order asked; None for one not held, missing, truncated or
        corrupt (the last two are deleted)."""
        for key in keys:
            _check_key(key)
        out: list[Record | None] = [None] * len(keys)
        reads = []
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._queue:
                    out[i] = self._queue[key]
                    self._counts["hits"] += 1
                elif key in self._index:
                    reads.append(i)
                else:
                    self._counts["misses"] += 1
            pool = len(reads) > 1 and not self._closing
        wanted = [keys[i] for i in reads]
        records = self._pool.map(self._read, wanted) if pool else map(self._read, wanted)
        for i, record in zip(reads, records):
            out[i] = record
        return out

    def _read(self, key: bytes) -> Record | None:
        path, record = self._path(key), None
        try:
            data = path.read_bytes()
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                log.warning("prompt cache on disk: cannot read %s (%s)", path, e)
            data = None
        if data is not None:
            try:
                record = blockfile.decode(data, key, self.scope)
            except blockfile.Corrupt as e:
                log.warning("prompt cache on disk: %s is corrupt (%s); deleted", path, e)
                _unlink(path)
            else:
                _touch(path)
        with self._lock:
            self._counts["read_bytes"] += len(data or b"")
            self._counts["hits" if record else "misses"] += 1
            self._counts["corrupt"] += data is not None and record is None
            if record:
                if key in self._index:
                    self._index.move_to_end(key)
            elif key in self._index:
                self._bytes -= self._index.pop(key)
        return record

    def _let_go(self) -> None:
        """Drop the records the writer is done with, here on the engine thread (put and close);
        the queue's bytes count them until then."""
        with self._lock:
            done, self._done = self._done, []
            self._queued -= sum(r.nbytes() for r in done)
        del done

    def stats(self) -> dict:
        """Ints for /metrics (misses include corrupt files; `skipped` counts puts not written),
        and `writing`: False while writes are stopped or below the floor (from any thread)."""
        with self._lock:
            return {
                "blocks": len(self._index),
                "bytes": self._bytes,
                "cap_bytes": self.cap,
                **self._counts,
                "queued_bytes": self._queued,
                "writing": not (self._stopped or self._low),
            }

    def close(self, timeout: float = 5.0) -> None:
        """Let the writer finish the queue for up to `timeout` seconds, then stop it (what it has
        not written is dropped, and counted as skipped)."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._writer.is_alive():
            self._writer.join(timeout)
        if self._writer.is_alive():
            log.warning("prompt cache on disk: still writing after %gs; dropping the rest", timeout)
            with self._lock:
                self._abandon = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._let_go()

    # --- the writer thread ---------------------------------------------------------------------

    def _write_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._queue and not self._closing:
                        self._wake.wait()
                    if not self._queue or self._abandon:
                        break
                    key, record = next(iter(self._queue.items()))
                size = self._write(key, record)
                del record  # the queue's reference alone, which goes to the engine thread
                with self._lock:
                    self._done.append(self._queue.pop(key))
                    if size:
                        self._index[key] = size
                        self._bytes += size
                        self._counts["written_bytes"] += size
                    else:
                        self._counts["skipped"] += 1
        finally:
            with self._lock:
                self._counts["skipped"] += len(self._queue)
                self._done.extend(self._queue.values())
                self._queue.clear()
            scopes.release(self._lock_fd)

    def _write(self, key: bytes, record: Record) -> int:
        """The bytes of the file written, 0 when skipped; never raises."""
        if self._stopped:
            return 0
        try:
            return self._write_file(key, record)
        except Exception as e:  # the writer must outlive anything, and serving goes on
            with self._lock:
                self._stopped = str(e)
            if isinstance(e, OSError):
                log.warning("prompt cache on disk: writing stopped (%s); serving goes on", e)
            else:
                log.exception("prompt cache on disk: writing stopped; serving goes on")
            return 0

    def _write_file(self, key: bytes, record: Record) -> int:
        pieces = blockfile.encode(key, self.scope, record)
        size = sum(memoryview(p).nbytes for p in pieces)
        if size > self.cap:
            return 0
        free = shutil.disk_usage(self.dir).free
        if free - size < self.floor:
            if not self._low:
                log.warning(
                    "prompt cache on disk: %d bytes free, under the floor of %d; not writing "
                    "until there is room",
                    free,
                    self.floor,
                )
            with self._lock:
                self._low = True
            return 0
        with self._lock:
            self._low = False
            over = self._evict(self.cap - size)
        for path in over:
            path.unlink(missing_ok=True)  # an OSError here stops writes, as a failed write does
        final = self._path(key)
        temp = final.with_name(final.name + TEMP)
        final.parent.mkdir(exist_ok=True)
        try:
            with open(temp, "wb") as f:
                for piece in pieces:
                    f.write(piece)
            os.replace(temp, final)
        except BaseException:
            _unlink(temp)
            raise
        return size


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # evicted meanwhile: its next read is a miss
