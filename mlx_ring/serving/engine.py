"""Rank 0's engine: the one thread that owns MLX, fed by the HTTP side through queues.

Requests arrive on a bounded queue and become sequences of the continuous-batching `Scheduler`,
which shares forward steps among them; each one's `Answer` (answer.py) ends it (end token, length,
stop strings), and results and errors travel back as values through `Request.emit`.
"""

import bisect
import itertools
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlx_ring.exits import DEVICE_FAILED, RING_BROKEN, gpu_failure
from mlx_ring.gpu import device_failure
from mlx_ring.ring.handle import RingError
from mlx_ring.serving.answer import Answer
from mlx_ring.serving.port import (
    STEP_BUCKETS,
    Done,
    Failed,
    PrefillProgress,
    PromptCacheStats,
    QueueFull,
    Request,
    Stats,
    Unavailable,
)
from mlx_ring.serving.sampling import Token
from mlx_ring.serving.scheduler import Scheduler, Sequence

log = logging.getLogger(__name__)


class Engine:
    """Rank 0's engine; the HTTP side sees it through `port.EnginePort`
    (submit, cancel, stats, ping)."""

    def __init__(
        self,
        sched: Scheduler,
        tokenizer: TokenizerWrapper,
        *,
        max_queue: int = 64,
        max_active: int = 16,
        step_timeout: float = 60.0,
        drain_timeout: float = 30.0,
        constrain: Callable | None = None,
    ):
        self.sched, self.pipe, self.tokenizer = sched, sched.pipe, tokenizer
        self.requests: queue.Queue[Request] = queue.Queue(max_queue)
        self.calls: queue.Queue[Future] = queue.Queue()  # pings waiting for a STATUS step
        self.active: dict[int, Answer] = {}
        self.max_active = max_active
        self.seq_ids = itertools.count(1)
        self.stopping = threading.Event()
        self.step_timeout, self.drain_timeout = step_timeout, drain_timeout
        self.broken: str | None = None  # why the ring is unusable; the process exits soon after
        self.finished = False  # the ring has shut down: pings are answered at once
        # Closing and submitting take this lock, so a request is either queued before
        # the engine closes (and then answered by `_close`) or refused; none slips in
        # between and waits forever.
        self._gate = threading.Lock()
        self.closed: str | None = None  # why no request is taken any more
        self.exit = exit_after_grace  # how a broken ring ends the process (tests replace it)
        self.busy_s = 0.0  # rank 0's time in ring steps, its waits on the other ranks included
        self.step_counts = [0] * (len(STEP_BUCKETS) + 1)  # ring steps by time (port.STEP_BUCKETS)
        self.peers = ""  # the other ranks and their hosts, named in ring errors (server.py sets it)
        # the control link's word on which worker is stuck, at a time (startup.py sets it)
        self.stuck: Callable[[float], str | None] | None = None
        self.constrain = constrain  # a grammar -> its logits processor (serving/grammar.py)
        # the prompts prefilling now, as the engine thread last saw them (read by `stats`)
        self.prefills: tuple[PrefillProgress, ...] = ()
        # False: the events carry tokens only, and the HTTP process makes their text (bridge.py)
        self.detokenize = True
        self.after_round: Callable[[], None] | None = None  # called at the end of every round
        # called twice a round before its step, once it took requests off the queue and once
        # their prefills began: the HTTP process's count of waiting requests must not lag
        self.before_step: Callable[[], None] | None = None

    # -- called from the HTTP thread
    # ----------------------------------------------------------------
    def submit(self, *reqs: Request) -> None:
        """Queue `reqs` (the choices of one API request): all of them, or none."""
        with self._gate:
            if self.closed or self.stopping.is_set():
                raise Unavailable(self.closed or "the server is shutting down")
            # Every put happens here, under this lock: the room seen here cannot shrink meanwhile.
            if self.requests.qsize() + len(reqs) > self.requests.maxsize:
                raise QueueFull(
                    (
                        f"{self.requests.qsize()} requests are already waiting (at most "
                        f"{self.requests.maxsize})"
                    )
                )
            for req in reqs:
                self.requests.put_nowait(req)

    def cancel(self, *reqs: Request) -> None:
        """Stop and free `reqs` (the engine thread finishes them before its next step)."""
        for r in reqs:
            r.cancelled.set()

    def ping(self) -> Future:
        """A STATUS step round every rank, between generation steps; resolves to one dict per rank:
        memory, open sequences, cached tokens, stage and busy time."""
        fut: Future = Future()
        # `_finish_calls` fails what is queued under it: none is queued after and left
        with self._gate:
            if self.broken or self.finished:
                fut.set_exception(RingError(self.broken or "the ring has shut down"))
            else:
                self.calls.put(fut)
        return fut

    def stats(self) -> Stats:
        """Rank 0's own figures now (ints the engine thread updates, read without a lock)."""
        sched, prefix = self.sched, self.sched.prefix
        cache = (
            None
            if prefix is None
            else PromptCacheStats(
                len(prefix.entries),
                prefix.held,
                prefix.budget,
                prefix.hits,
                prefix.hit_tokens,
                prefix.block,
                prefix.disk_tokens,
                prefix.disk.stats() if prefix.disk is not None else None,
            )
        )
        return Stats(
            queued=self.requests.qsize(),
            active=len(self.active),
            broken=self.broken,
            stopping=self.stopping.is_set(),
            prompt_cache=cache,
            draft_tokens=sched.draft_tokens,
            drafted=sched.drafted,
            accepted=sched.accepted,
            step_counts=tuple(self.step_counts),
            step_seconds=self.busy_s,
            waiting=len(sched.waiting),
            prefills=self.prefills,
        )

    # -- the engine thread
    # --------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until `stop()`, then drain (finish running requests, up to `drain_timeout`) and
        tell every rank to shut down. A broken ring ends the process instead (see `_die`)."""
        threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        try:
            while not self.stopping.is_set():
                self._serve_round()
            deadline = time.monotonic() + self.drain_timeout
            self._close(
                "the server is shutting down",
                Failed("the server is shutting down", 503, "service_unavailable"),
            )
            while self.active and time.monotonic() < deadline:
                self._serve_round()
            for a in list(self.active.values()):
                self._finish(a, Failed("the server is shutting down", 503, "service_unavailable"))
            # let every rank free what it holds (and answer pings meanwhile)
            while not self.sched.idle():
                self._take_calls()
                self.sched.step()
            # later pings: answered at once, not in 10 s
            self._finish_calls("the ring has shut down")
            self.pipe.shutdown()
        # First: a ring step's eval wraps the GPU's failure in a RingError.
        except Exception as e:
            if (failed := device_failure(e)) is not None:
                log.error("%s", gpu_failure(0, failed))
                self._die(gpu_failure(0, failed), named=True, code=DEVICE_FAILED)
            elif isinstance(e, RingError):
                self._die(str(e))
            else:  # a bug on rank 0 leaves the ranks' caches in an unknown state: restart
                log.exception("engine failure")
                self._die(f"internal error on rank 0: {e}")

    def _serve_round(self) -> None:
        self._take_calls()
        if not self.stopping.is_set():
            self._admit(block=self.sched.idle())
        elif self.sched.idle():
            time.sleep(0.01)
        for a in list(self.active.values()):
            if a.req.cancelled.is_set():
                self._finish(a, Failed("cancelled by the client", 499, "cancelled"))
        if self.before_step is not None:  # what it took leaves before its first chunk is computed
            self.before_step()
        busy, t0 = not self.sched.idle(), time.perf_counter()
        # scheduled first, so that the prompts whose prefill begins now hear of it before rank 0
        # waits on the ring (the step's own scheduling then finds nothing more to send)
        self.sched.schedule()
        self._prefilling()
        if self.before_step is not None:
            self.before_step()
        results = self.sched.step()
        if busy:  # rank 0's busy time: its steps, waits on the other ranks included
            took = time.perf_counter() - t0
            self.busy_s += took
            self.step_counts[bisect.bisect_left(STEP_BUCKETS, took)] += 1
        for seq, token in results:  # a token, or the error that sampling it raised
            # a sequence given several tokens at once may end before the last
            a = self.active.get(seq.id)
            if a is None:
                continue
            try:
                self._advance(a, token)
            # its text (detokenizer, stop strings) failed: this request alone
            except Exception as e:
                log.exception("sequence %d: its text could not be made", seq.id)
                if seq.id in self.active:
                    self._finish(
                        a,
                        Failed(
                            f"the answer's text could not be made: {type(e).__name__}: {e}",
                            500,
                            "server_error",
                        ),
                    )
        if self.after_round is not None:
            self.after_round()

    def stop(self) -> None:
        """Stop taking requests and drain; safe to call from a signal handler."""
        self.stopping.set()

    def _close(self, reason: str, answer: Failed) -> None:
        """Take no more requests, and give every waiting one `answer`."""
        with self._gate:
            self.closed = reason
        while True:
            try:
                _tell(self.requests.get_nowait(), answer)
            except queue.Empty:
                return

    def _watchdog(self) -> None:
        # MLX's ring has no timeout: a stopped or silent peer blocks recv forever, so time the waits
        # on it here (only the waits: rank 0's own compute is not the other ranks' fault).
        while True:
            time.sleep(0.2)
            started, now = self.pipe.busy_since, time.monotonic()
            if started is not None and now - started > self.step_timeout:
                # the control link's beats may name the rank whose steps stopped
                named = self.stuck(now) if self.stuck is not None else None
                self._die(
                    named
                    or (
                        f"a ring step got no answer within {self.step_timeout:.0f} s (a rank is "
                        "stopped, hung or unreachable)"
                    ),
                    named=named is not None,
                )

    def _die(self, reason: str, named: bool = False, code: int = RING_BROKEN) -> None:
        """The ring cannot be trusted any more: fail every request with a clear error, then exit
        (`code`) so that mlx.launch stops the other ranks and the launcher restarts the ring. The
        engine thread and the watchdog may both call it; the first one does it. `named`: the
        reason names the rank."""
        where = f" (the ring's other ranks: {self.peers})" if self.peers and not named else ""
        failed = Failed(f"ring failure: {reason}{where}", 503, "service_unavailable")
        with self._gate:
            if self.broken:
                return
            self.broken = reason
            self.closed = failed.message
            active = list(self.active.values())  # admissions check `closed` under the gate
        try:
            log.error(
                "ring failure: %s; failing %d request(s) and exiting for a restart",
                reason,
                len(active) + self.requests.qsize(),
            )
            for a in active:
                _tell(a.req, failed)
            self._close(failed.message, failed)
            self._finish_calls(reason)
        finally:  # whatever failed above (an HTTP loop already closed), the process must still exit
            self.exit(code)

    def _finish_calls(self, reason: str) -> None:
        """Fail every ping still queued, and any that comes later (`ping` checks `finished`)."""
        with self._gate:
            self.finished = True
        while True:
            try:
                fut = self.calls.get_nowait()
            except queue.Empty:
                return
            if not fut.done():
                fut.set_exception(RingError(reason))

    def fail(self, reason: str) -> None:
        """The launcher's word that a rank's host went, naming it (server.py's SIGUSR1)."""
        self._die(reason, named=True)

    def _take_calls(self) -> None:
        while True:
            try:
                fut = self.calls.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                # between the other steps
                self.sched.status(lambda rows, fut=fut: fut.set_result(self._with_busy(rows)))

    def _with_busy(self, rows: list[dict]) -> list[dict]:
        # rank 0's steps are timed here, not by its stage
        rows[0]["busy_cs"] = int(self.busy_s * 100)
        return rows

    def _admit(self, block: bool) -> None:
        while len(self.active) < self.max_active:
            try:
                req = self.requests.get(timeout=0.05) if block else self.requests.get_nowait()
            except queue.Empty:
                return
            block = False
            if req.cancelled.is_set():  # the client left while it waited: nothing to compute
                req.emit(Failed("cancelled by the client", 499, "cancelled"))
                continue
            try:
                seq = Sequence(
                    next(self.seq_ids),
                    req.prompt,
                    req.params,
                    self.constrain,
                    max_tokens=req.max_tokens,
                )
            except Exception as e:  # e.g. a sampler that cannot be built from these parameters
                req.emit(Failed(f"cannot start generation: {e}", 400, "invalid_request_error"))
                continue
            seq.after, req.sequence = req.after and req.after.sequence, seq
            with self._gate:  # a ring failure fails what is active, or this sees it closed
                if self.closed:
                    req.emit(Failed(self.closed, 503, "service_unavailable"))
                    continue
                tokenizer = self.tokenizer if self.detokenize else None
                self.active[seq.id] = Answer(req, seq, tokenizer)
            self.sched.add(seq)

    def _prefilling(self) -> None:
        """Tell each request whose prompt began its prefill (its cached start now known), and
        keep every prefill's progress for `stats` as plain values."""
        rows = [
            (self.active[seq.id], done)
            for b in self.sched.prefilling
            for seq, done in b.progress()
            if seq.id in self.active
        ]
        # first: a client told may already ask for the status
        self.prefills = tuple(
            PrefillProgress(len(a.seq.prompt), done, a.seq.cached) for a, done in rows
        )
        for a, _ in rows:
            a.start()

    def _advance(self, a: Answer, token: Token | Exception) -> None:
        if isinstance(token, Exception):  # this request's sampling failed; the others go on
            return self._finish(
                a, Failed(f"sampling failed for this request: {token}", 500, "server_error")
            )
        if (done := a.add(token, self.tokenizer.eos_token_ids)) is not None:
            self._finish(a, done)

    def _finish(self, a: Answer, outcome: Done | Failed) -> None:
        del self.active[a.seq.id]
        a.req.emit(outcome)
        self.sched.remove(a.seq)  # its cache rows go on every rank before its group's next step


def _tell(req: Request, event) -> None:
    """`req.emit(event)`, whose failure (its HTTP loop closed) stops nothing here."""
    try:
        req.emit(event)
    except Exception as e:
        log.warning("could not hand an event to a request: %s", e)


def exit_after_grace(code: int) -> None:
    time.sleep(1.0)  # let the HTTP thread send the errors
    # at once: mlx.launch then stops the other ranks, and the launcher restarts the ring
    os._exit(code)
