"""Rank 0's handle on the ring: the contract between the serving side (scheduler, runner, engine)
and the two ways of driving the ring, `pipeline.Pipeline` (a range of layers per rank, steps in
flight round the ring) and `mlx_ring.tensor.lockstep.Lockstep` (tensor mode: every rank on every
step). The serving side imports this module and neither handle; `SharedSteps` is what the two
have in common."""

import time
from contextlib import contextmanager
from typing import Protocol

import mlx.core as mx

from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import Ring


class RingError(RuntimeError):
    """The ring is broken (a peer died or answered out of step); only a restart mends it."""


class Stage(Protocol):
    """Rank 0's slice of the model, as a handle sees it (`shard.Shard`)."""

    def apply(self, header: Header, payload: mx.array | None) -> mx.array | None: ...


class RingHandle(Protocol):
    """Submit steps, collect their outputs in the order submitted. Every method that waits on the
    other ranks raises RingError when the ring breaks under it."""

    stage: Stage
    ring: Ring
    busy_since: float | None  # when the wait on the other ranks now running began (the watchdog's)

    def can_submit(self, chained: bool = False) -> bool:
        """Whether one more step may go out now (the handle bounds the steps outstanding);
        `chained`: a DECODE step built on ids not yet read."""
        ...

    def outstanding(self) -> int:
        """Steps submitted and not yet collected."""
        ...

    def submit(
        self, header: Header, payload: mx.array | None, tag: object = None, chained: bool = False
    ) -> None:
        """Start the step; `collect` hands `tag` back with its output. `chained`: its payload is
        built on the last DECODE step's output, not yet read (tokens its group still samples)."""
        ...

    def prefetch(self, *arrays: mx.array) -> None:
        """Start computing `arrays`, which the caller reads after submitting a step on them."""
        ...

    def settle(self) -> None:
        """Finish the last DECODE output, if that is still to do: before anything on it is read."""
        ...

    def make_way(self) -> None:
        """Before other steps (calls, frees, rows leaving or joining) go out ahead of a chained
        DECODE step, while the last DECODE output may still be unread."""
        ...

    def collect(self) -> tuple[object, mx.array | None]:
        """The oldest outstanding step's tag and output. A DECODE step's output comes back
        unevaluated: the caller builds on it (head, sampling, the next step) and calls `settle()`
        before it reads."""
        ...

    def round_trip(self, header: Header, payload: mx.array | None = None) -> mx.array | None:
        """One step on every rank with nothing else outstanding (tests, shutdown)."""
        ...

    def shutdown(self) -> None:
        """Collect what is outstanding, then tell every rank to leave."""
        ...


class SharedSteps(RingHandle):
    """What both handles do alike, over their own `submit`, `collect`, `settle`: the clock on the
    waits that the engine's watchdog reads, one step alone, and the shutdown."""

    busy_since: float | None = None

    def make_way(self) -> None:
        # The pipeline's next rank may be blocked sending that output home: nothing else leaves
        # before it is read off the socket.
        self.settle()

    @contextmanager
    def watching(self):
        """Mark a wait on the other ranks, for the watchdog (nests)."""
        outer = self.busy_since
        self.busy_since = outer or time.monotonic()
        try:
            yield
        finally:
            self.busy_since = outer

    def round_trip(self, header: Header, payload: mx.array | None = None) -> mx.array | None:
        """One step on every rank with nothing else outstanding (tests, shutdown)."""
        assert not self.outstanding()
        self.submit(header, payload)
        return self.collect()[1]

    def shutdown(self) -> None:
        """Collect what is outstanding, then send SHUTDOWN round: every rank leaves."""
        while self.outstanding():
            self.collect()
        self.settle()
        self.leaving()
        self.round_trip(Header(Kind.SHUTDOWN))

    def leaving(self) -> None:
        """Nothing is outstanding and SHUTDOWN goes next: the ranks' leaving is no fault now."""
        control = getattr(self.ring, "control", None)
        if control is not None:
            control.stop()
