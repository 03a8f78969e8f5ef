"""Rank 0's handle on the ring.

`Pipeline` is the only code that starts work on the ring. It keeps several steps in flight so that
rank 0 computes its stage of the next step while the other ranks compute theirs; how many, it
decides so that the ring can never deadlock (see `Pipeline.limit`).
"""

from collections import deque

import mlx.core as mx

from mlx_ring.ring.handle import RingError, SharedSteps, Stage
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import Ring

# A prompt-cache save is a few ints each way and a copy on each rank. Held back for a place on the
# ring, it would leave every rank idle for a stage (two ranks: a step in flight at most); so it goes
# on at once, behind the steps before it. No cycle of blocked sends can form from it: each blocked
# send in such a cycle waits behind a step of the others on its link, so the cycle would need N of
# them on a ring that carries at most N - 1.
LIGHT = frozenset({Kind.SAVE, Kind.SAVE_ROW})


class Pipeline(SharedSteps):
    """Submit steps (rank 0 applies its own stage at once), collect them as they come home,
    in order. The watchdog times the waits on the other ranks only: a slow stage of rank 0's
    is no hung peer."""

    def __init__(self, stage: Stage, ring: Ring):
        assert ring.rank == 0, "only rank 0 drives the ring"
        self.stage, self.ring = stage, ring
        # Every rank alternates one blocking recv and one blocking send. With at most N-1
        # steps on the ring when rank 0 sends, some rank is always receiving, so no cycle of
        # blocked sends can form.
        self.limit = max(1, ring.size - 1)
        # sent, not yet back (with their tags); `heavy`: those not LIGHT, which `limit` bounds
        self.inflight: deque[tuple[Header, object]] = deque()
        self.heavy = 0
        # applied here, not yet sent (alone: done)
        self.ready: deque[tuple[Header, mx.array | None, bool, object]] = deque()
        # A DECODE step's payload, received lazily and not yet read off the socket. Rank 0 sends
        # nothing before reading it: the last rank may be blocked sending it (when it does not fit
        # the sockets' buffers) while rank 0 blocks sending to rank 1, and the ring would deadlock.
        self.unread: mx.array | None = None

    def can_submit(self, chained: bool = False) -> bool:
        """On a ring, while no step waits here for its place. A `chained` DECODE step may also wait
        behind others (what goes just before it: calls, frees, rows leaving or joining; another
        group's step), so the chain goes on through a join or a leave; each group has one at most
        (its next is built once it is home), so the wait stays short."""
        return self.ring.size == 1 or not self.ready or chained

    def outstanding(self) -> int:
        return len(self.inflight) + len(self.ready)

    def submit(
        self, header: Header, payload: mx.array | None, tag: object = None, chained: bool = False
    ) -> None:
        """Apply `header` on rank 0; it goes on round the ring as soon as the ring has room, and
        `collect` hands `tag` back with it. `chained`: the step is built on the last DECODE payload,
        still unread (a group's next step built on the tokens just sampled from it)."""
        assert self.can_submit(chained)
        out = self.stage.apply(header, payload)
        self.ring.mark("built", header)
        if self.ring.size == 1:
            if out is not None:
                mx.async_eval(out)  # alone: runs while the caller reads the previous step's tokens
        elif self.ready or self.heavy >= self.limit:
            if out is not None:
                self.settle()  # the stage may be built on the last payload: read it, timed, first
                # no room on the ring: compute rank 0's stage now, while the others work
                mx.eval(out)
        # else the send below computes it: its header leaves first, so the next rank builds its own
        # graph while this stage still computes.
        self.ready.append((header, out, chained, tag))
        self._send_ready()

    def prefetch(self, *arrays: mx.array) -> None:
        """Start computing `arrays`, which the caller reads after submitting a step built
        on them. On a ring, that step's send computes them; alone, they would sit in the
        step's own graph and be read only when the whole step is done (the GPU idle while
        rank 0 handles their tokens)."""
        if self.ring.size == 1:
            mx.async_eval(*arrays)

    def settle(self) -> None:
        """Read the last DECODE payload off the socket, if that is still to do."""
        if self.unread is not None:
            try:
                with self.watching():  # waits on the last rank, so the watchdog times it
                    self.ring.wait_payload()
                    mx.eval(self.unread)
            except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
                raise RingError(f"ring step DECODE failed: {e}") from e
            self.unread = None

    def collect(self) -> tuple[object, mx.array | None]:
        """The oldest outstanding step's tag and payload, back from the last rank. A DECODE
        step's payload comes back unevaluated: the caller builds on it (head, sampling, the next
        step) while it arrives, and calls `settle()` before it reads anything built on it;
        sending and collecting settle it."""
        if self.ring.size == 1:
            _, out, _, tag = self.ready.popleft()
            return tag, out
        self.settle()
        if not self.inflight:
            self._send_ready()
        expected, tag = self.inflight.popleft()
        self.heavy -= expected.kind not in LIGHT
        lazy = expected.kind == Kind.DECODE
        try:
            with self.watching():
                # the ring closes: rank N-1 hands the step back to rank 0
                back, out = self.ring.recv(lazy=lazy)
        except RuntimeError as e:  # MLX's ring backend reports a lost peer this way
            raise RingError(f"ring step {Kind(expected.kind).name} failed: {e}") from e
        if not back.same_step(expected):
            raise RingError(f"ring returned {back}, sent {expected}: the ranks are out of step")
        if lazy:
            self.unread = out
            if self.ready:
                # Another group's stage is computed and waits for room: read this payload off the
                # socket and send that one now, so rank 1 works on it while rank 0 runs the head.
                self.settle()
                self._send_ready()
        else:
            # the ring has room again: keep it busy before rank 0 looks at the result
            self._send_ready()
        return tag, out

    def _send_ready(self) -> None:
        while (
            self.ring.size > 1
            and self.ready
            and (self.heavy < self.limit or self.ready[0][0].kind in LIGHT)
        ):
            header, out, chained, tag = self.ready.popleft()
            try:
                with self.watching():
                    # the header first, so rank 1 builds its graph while rank 0 computes its stage
                    self.ring.send_header(header, out)
                if chained and self.unread is not None:
                    # One graph reads the last payload, computes rank 0's stage on it and sends it
                    # (one sync a token, not three; two on CUDA: Ring.compute_before_send); a decode
                    # stage takes milliseconds, so the watchdog may count it with the wait.
                    with self.watching():
                        self.ring.send_payload(header, out)
                    self.unread = None
                else:
                    self.settle()  # nothing else goes out before that payload is read
                    if out is not None:
                        mx.eval(out)  # rank 0's own stage: not a wait on the others, so not watched
                    with self.watching():
                        self.ring.send_payload(header, out)  # hand the step's payload to rank 1
            except RingError:
                raise
            except RuntimeError as e:
                raise RingError(f"ring step {Kind(header.kind).name} failed: {e}") from e
            self.inflight.append((header, tag))
            self.heavy += header.kind not in LIGHT
            if self.ring.control is not None:
                self.ring.control.issue()  # the workers' beats tell each one's steps done
