"""Tensor mode's ring: every rank runs every step at once, joined by the step's all_sums.

Rank 0 hands each step (its header and input: token ids, or a small table) to every other rank on
the control link (control.py); then every rank runs it. Nothing comes back round the ring: the
all_sums give every rank the same output, so rank 0's own is the step's result. A decode step built
on the tokens its group's last step is still sampling sends its header alone: the ids join every
rank's graph in one more all_sum (`summed_ids`), so no rank waits for them on the host: rank 0
builds and starts the step while the last one computes (as mlx-lm's generate loop does alone), and
the others build theirs while rank 0 runs the head and samples. `Lockstep` is rank 0's handle, a
`RingHandle` (ring/handle.py) as `Pipeline` is: the scheduler drives both modes alike.
"""

import logging
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import replace

import mlx.core as mx

from mlx_ring.exits import RING_BROKEN
from mlx_ring.ring.handle import RingError, SharedSteps, Stage
from mlx_ring.ring.protocol import DTYPES, Header, Kind
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.world import closed_peer

log = logging.getLogger(__name__)


class Lockstep(SharedSteps):
    """Submit steps (sent on, then applied here at once), collect their outputs in order. A step's
    own compute and its all_sums are one graph here, so the watchdog times both."""

    def __init__(self, stage: Stage, ring: Ring, sums: mx.distributed.Group):
        assert ring.rank == 0, "only rank 0 drives the ring"
        # sums: the group the step's all_sums run over
        self.stage, self.ring, self.sums = stage, ring, sums
        # Rank 0 builds the next step while the last one computes; a step's send waits for the steps
        # before it on rank 0 (one stream), so more outstanding ones would gain nothing.
        self.limit = 2
        # submitted, not yet collected
        self.done: deque[tuple[Header, mx.array | None, object]] = deque()
        # the last DECODE step handed out, its output not yet evaluated
        self.unread: tuple[Header, mx.array] | None = None
        self.watch: StepWatch | None = None

    def watch_peers(self, lost) -> None:
        """Call `lost(why)` (from another thread) when a rank leaves the ring: rank 0 may be waiting
        inside a step's all_sums, where neither MLX nor a signal handler would wake it."""
        self.watch = StepWatch(0, lost=lost)

    def can_submit(self, chained: bool = False) -> bool:
        return len(self.done) < self.limit

    def outstanding(self) -> int:
        return len(self.done)

    def submit(
        self, header: Header, payload: mx.array | None, tag: object = None, chained: bool = False
    ) -> None:
        """Send the step to every rank, then apply it here: its all_sums need every rank in them.
        `chained`: its token ids are the last DECODE step's, still being sampled: they go in the
        step's graph (`summed_ids`), and only the header goes on the wire."""
        assert self.can_submit(chained)
        # sampled ids
        wire = (
            payload.astype(mx.int32)
            if payload is not None and payload.dtype == mx.uint32
            else payload
        )
        if chained:
            header = replace(
                header, shape=tuple(wire.shape), dtype=DTYPES.index(mx.int32), summed=1
            )
            payload, wire = summed_ids(header, wire, self.sums), None
        try:
            with self.watching():
                self.ring.send(header, wire)  # the header (and a payload known here) to every rank
        except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
            raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
        out = self.stage.apply(header, payload)
        self.ring.mark("built", header)
        if out is not None:
            try:
                # waits while MLX holds too many unfinished steps: the last ones' all_sums
                with self.watching():
                    mx.async_eval(out)
            # the ring failed the step's all_sums at once (a peer is gone)
            except RuntimeError as e:
                raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
        self.done.append((header, out, tag))
        if chained:
            self.settle()  # the last step, now that this one is queued behind it: the wait is timed

    def make_way(self) -> None:
        """Nothing to do: nothing comes home on a socket, and the steps' all_sums keep their order,
        so the steps before a chained one go out while the last computes."""

    def prefetch(self, *arrays: mx.array) -> None:
        """Start computing `arrays`, which the caller reads after submitting a
        step built on them."""
        mx.async_eval(*arrays)

    def settle(self) -> None:
        """Evaluate the last DECODE output, if that is still to do: the wait inside
        its all_sums is timed."""
        if self.unread is not None:
            self._wait(*self.unread)
            self.unread = None

    def collect(self) -> tuple[object, mx.array | None]:
        """The oldest outstanding step's tag and output. A DECODE step's output comes back
        unevaluated: the caller builds on it (head, sampling, the next step) and calls `settle()`
        before it reads."""
        self.settle()
        header, out, tag = self.done.popleft()
        if out is not None and header.kind == Kind.DECODE:
            self.unread = (header, out)
        elif out is not None:
            self._wait(header, out)
        return tag, out

    def _wait(self, header: Header, out: mx.array) -> None:
        try:
            with self.watching():
                mx.eval(out)
        except RuntimeError as e:
            raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
        self.ring.mark("done", header)

    def leaving(self) -> None:
        """The watch ends: every rank leaves now, and a socket closing is no fault."""
        if self.watch is not None:
            self.watch.stop()
        super().leaving()


def summed_ids(header: Header, ids: mx.array | None, group: mx.distributed.Group) -> mx.array:
    """A `summed` step's token ids `header.shape` on every rank: rank 0's `ids` (int32,
    maybe still being sampled), zeros from the others, joined by an all_sum that runs in
    the step's own graph."""
    share = ids if ids is not None else mx.zeros(header.shape, dtype=mx.int32)
    return mx.distributed.all_sum(share, group=group)


class RankLeft(RuntimeError):
    """A tensor rank's step failed with the ring: the ring must restart
    (the process exits non-zero)."""


class StepWatch:
    """A tensor rank's watch on the ring. MLX's all_sum has no deadline, and a rank whose
    neighbour is gone may wait in it forever (rank 0 did, a stopped peer's socket closed
    under it). Every quarter second this looks for a neighbour's closed socket, and (with
    `timeout`) for a step running past it; either ends in `lost(why)`: by default the
    rank names it and exits (RING_BROKEN, as rank 0 does), so mlx.launch stops the ring
    and the launcher restarts it."""

    def __init__(self, rank: int, timeout: float | None = None, lost=None):
        self.rank, self.timeout, self.lost = rank, timeout, lost or self._exit
        self.current: tuple[Header, float] | None = None
        self.stopped = False
        threading.Thread(target=self._watch, name="step-watch", daemon=True).start()

    @contextmanager
    def step(self, header: Header):
        self.current = (header, time.monotonic())
        try:
            yield
        except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
            raise RankLeft(
                f"rank {self.rank}: step {Kind(header.kind).name} failed with the ring: {e}"
            ) from e
        finally:
            self.current = None

    def stop(self) -> None:
        """The ring is shutting down: its ranks leave, and that is no fault."""
        self.stopped = True

    def _watch(self) -> None:
        while not self.stopped:
            time.sleep(0.25)
            gone, now = closed_peer(), self.current
            if self.stopped:
                return
            if gone is not None:
                why = f"rank {gone} left the ring (its connection to rank {self.rank} closed)"
            elif self.timeout and now is not None and time.monotonic() - now[1] > self.timeout:
                why = (
                    f"step {Kind(now[0].kind).name} got no answer from the other ranks within "
                    f"{self.timeout:.0f} s (a rank is stopped, hung or unreachable)"
                )
            else:
                continue
            self.stopped = True
            self.lost(why)

    def _exit(self, why: str) -> None:
        log.error("rank %d: %s; exiting for a restart", self.rank, why)
        logging.shutdown()
        os._exit(RING_BROKEN)
