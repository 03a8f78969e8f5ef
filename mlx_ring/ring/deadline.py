"""Deadlines for a rank's waits on its neighbours where the transport has none (JACCL).

On TCP a worker waits for the previous rank in `select()` on MLX's ring sockets, so a SIGTERM is
seen and a closed peer wakes it. JACCL has no sockets to watch, and a lost or stopped peer leaves
every other rank spinning inside MLX's native code, where no Python signal handler runs
(ml-explore/mlx #3910, #4278). So a thread of its own times each wait, learns of a SIGTERM from the
signal's wakeup file descriptor (written by the C-level handler, whatever the main thread is doing),
and ends the process with a sentence naming the rank it waited on: mlx.launch then stops the others
and the launcher restarts the ring, as on TCP.
"""

import logging
import os
import select
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from mlx_ring import settings
from mlx_ring.exits import RING_BROKEN

log = logging.getLogger("ring")


def leave(reason: str) -> None:
    """End this rank now, saying why (the launcher reads the line back from the ranks' output)."""
    log.error("ring deadline: rank %s %s; leaving", settings.text("MLX_RANK") or "?", reason)
    logging.shutdown()
    os._exit(RING_BROKEN)  # as rank 0's engine exits on a broken ring: the launcher restarts it


@dataclass(frozen=True)
class Wait:
    what: str | Callable[[], str]  # what this rank waits for, naming the rank it waits on
    since: float  # monotonic seconds
    bounded: bool  # False for the wait for a step's header: a ring with nothing to do is silent


class Deadlines:
    """Times one wait at a time (the thread that owns MLX waits on one thing at once). A bounded
    wait may last `limit` seconds (STEP_TIMEOUT: a whole trip round the ring takes less); any
    wait may last `quiet` seconds after a SIGTERM (rank 0 drains for at most that long, so a
    longer silence means no drain is going on)."""

    def __init__(self, limit: float, on_expire: Callable[[str], None] = leave):
        self.limit, self.on_expire = limit, on_expire
        self.wait: Wait | None = None
        # when a SIGTERM came, and the silence allowed since
        self.term: tuple[float, float] | None = None
        self.quiet = limit

    @contextmanager
    def waiting(self, what: str | Callable[[], str], bounded: bool = True):
        """Mark a wait on a neighbour (not nested: the innermost is timed); `what` may be a function
        that gives the words, called only if the wait is overdue."""
        outer, self.wait = self.wait, Wait(what, time.monotonic(), bounded)
        try:
            yield
        finally:
            self.wait = outer

    def terminate(self, quiet: float) -> None:
        """A SIGTERM came: any wait may now last `quiet` seconds from now (or from
        its start, if later)."""
        if self.term is None:
            self.term = (time.monotonic(), quiet)

    def overdue(self, now: float) -> str | None:
        """Why this rank must leave at `now`, or None."""
        w = self.wait
        if w is None:
            return None
        what = w.what() if callable(w.what) else w.what
        if w.bounded and now - w.since > self.limit:
            return (
                f"waited {now - w.since:.0f} s for {what}, over STEP_TIMEOUT ({self.limit:.0f} s): "
                "the rank waited on is stopped, hung or unreachable"
            )
        if self.term is not None and now - max(w.since, self.term[0]) > self.term[1]:
            return (
                "was asked to stop (SIGTERM) and has waited "
                f"{now - max(w.since, self.term[0]):.0f} s since for {what}, which did not come"
            )
        return None

    def start(self, quiet: float, watch_sigterm: bool = True) -> None:
        """Time the waits from a daemon thread. `watch_sigterm` (call from the main thread): a
        SIGTERM starts the `quiet` clock even while the main thread is stuck in native code."""
        self.quiet = quiet
        wake = None
        if watch_sigterm:
            r, w = os.pipe()
            os.set_blocking(w, False)
            signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                # The wakeup fd is written only for signals Python handles; the rank's own handler
                # (ring/worker.serve_worker) replaces this one.
                signal.signal(signal.SIGTERM, lambda *_: self.terminate(quiet))
            wake = r
        threading.Thread(target=self._run, args=(wake,), name="ring-deadlines", daemon=True).start()

    def _run(self, wake: int | None) -> None:
        while True:
            if wake is not None and select.select([wake], [], [], 0.2)[0]:
                if signal.SIGTERM in os.read(wake, 512):
                    self.terminate(self.quiet)
            elif wake is None:
                time.sleep(0.2)
            if (reason := self.overdue(time.monotonic())) is not None:
                self.on_expire(reason)
                return
