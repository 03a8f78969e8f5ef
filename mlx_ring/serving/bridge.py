"""Rank 0's engine served to its HTTP process (api/process.py) over one socket (serving/wire.py):
a reader thread turns SUBMIT, CANCEL and PING into the engine's own calls; the engine's events
leave as one STEP message before a round's step (the requests it took, the prefills it began) and
one after it (every row's tokens), sent from a thread of its own, so the engine thread only
appends to a list and never waits on the HTTP side. Tokens only: the HTTP process makes the text
and finds the stop strings."""

import logging
import os
import threading
import time
from typing import Callable

from mlx_ring import exits
from mlx_ring.serving import wire
from mlx_ring.serving.port import Done, Failed, QueueFull, Request, Started, Unavailable

log = logging.getLogger(__name__)

STATS_EVERY_S = 0.1  # the most the HTTP side's copy of the engine's figures lags while it runs
# events left by no round (a ring failure fails every request off the engine's rounds) go after this
STRAY_S = 0.05


class Bridge:
    def __init__(self, engine, sock, describe: Callable[[], str] = lambda: "the HTTP process"):
        """`describe()`: the HTTP process in words (its pid, its exit code once known)."""
        self.engine, self.sock, self.describe = engine, sock, describe
        self.out = wire.Outbox(sock, "to-http")
        self.rows: dict[int, Request] = {}  # by the HTTP side's id, until they end
        self.queued: dict[int, Request] = {}  # of those, the ones not yet taken off the queue
        self._events: list = []
        self._lock = threading.Lock()
        self._last_stats = 0.0
        self._stats_bytes = len(self._stats())  # what each STATS is reckoned until it is made
        self.ready = threading.Event()
        self.refused: str | None = None  # why the HTTP server could not start
        self.closing = False
        self.lost = exit_http_lost  # how the engine process ends when its HTTP process is gone
        engine.detokenize = False
        engine.after_round = engine.before_step = self.flush
        self._reader = threading.Thread(target=self._read_all, name="from-http", daemon=True)
        self._flushed = time.monotonic()

    def start(self, hello: dict) -> None:
        """Send HELLO (what the HTTP process serves), then read its messages."""
        self.out.put(wire.pack(wire.HELLO, **hello, stats=wire.stats_out(self.engine.stats())))
        self._reader.start()
        threading.Thread(target=self._strays, name="strays", daemon=True).start()

    def _strays(self) -> None:
        while not self.closing:
            time.sleep(STRAY_S)
            if self._events and time.monotonic() - self._flushed > STRAY_S:
                self.flush()

    def close(self) -> None:
        """The engine has stopped: send the last events and BYE, then close the socket (the HTTP
        process exits on it)."""
        self.closing = True
        self.flush(stats=True)
        self.out.put(wire.pack(wire.BYE))
        self.out.close()
        self.sock.close()

    # -- the engine thread (and the reader, for refusals) -----------------------------------------
    def _emit(self, rid: int, ev) -> None:
        with self._lock:
            self._events.append((rid, ev))

    def flush(self, stats: bool = False) -> None:
        """The round's events as one STEP, the engine's figures before it when they may have
        changed (an answer began or ended, or STATS_EVERY_S passed)."""
        with self._lock:  # and the puts under it: the HTTP side reads the rounds in order
            events, self._events = self._events, []
            taken = [i for i, r in self.queued.items() if r.sequence is not None]
            for rid, ev in events:
                if isinstance(ev, (Done, Failed)):
                    self.rows.pop(rid, None)
                self.queued.pop(rid, None)
            for rid in taken:
                self.queued.pop(rid, None)
            now = self._flushed = time.monotonic()
            ends = any(isinstance(ev, (Started, Done, Failed)) for _, ev in events)
            if stats or ends or taken or now - self._last_stats > STATS_EVERY_S:
                self._last_stats = now
                self.out.put(self._stats, self._stats_bytes)
            if events or taken:
                self.out.put(lambda: _step(events, taken), wire.step_bytes(events))

    def _stats(self) -> bytes:
        return wire.pack(wire.STATS, stats=wire.stats_out(self.engine.stats()))

    # -- the reader thread -------------------------------------------------------------------------
    def _read_all(self) -> None:
        reader = wire.Reader(self.sock)
        try:
            while (msg := reader.read()) is not None:
                self._handle(msg)
        except Exception:
            log.exception("a message from the HTTP process could not be read")
        self.ready.set()
        if not self.closing and self.refused is None:  # a refusal ends the start-up instead
            self.lost(f"{self.describe()} ended; the engine process exits for a restart")

    def _handle(self, msg: dict) -> None:
        kind = msg["k"]
        if kind == wire.SUBMIT:
            self._submit(msg["reqs"])
        elif kind == wire.CANCEL:
            for rid in msg["ids"]:
                if (r := self.rows.get(rid)) is not None:
                    self.engine.cancel(r)
        elif kind == wire.PING:
            self.engine.ping().add_done_callback(lambda f, i=msg["id"]: self._pong(i, f))
        elif kind == wire.READY:
            self.ready.set()
        elif kind == wire.REFUSED:
            self.refused = msg["why"]
            self.ready.set()
        else:
            log.warning("the HTTP process sent a message of unknown kind %r", kind)

    def _submit(self, items: list[dict]) -> None:
        reqs: list[tuple[int, Request]] = []
        for it in items:
            rid = it["id"]
            after = self.rows.get(it["after"]) if it.get("after") is not None else None
            req = Request(
                it["prompt"],
                it["max_tokens"],
                wire.params_of(it["params"]),
                emit=lambda ev, rid=rid: self._emit(rid, ev),
                after=after,
            )
            reqs.append((rid, req))
            with self._lock:
                self.rows[rid] = req
                self.queued[rid] = req
        try:
            if self.out.full():
                raise QueueFull("the HTTP process is slow to read the answers")
            self.engine.submit(*(r for _, r in reqs))
            self.out.put(self._stats, self._stats_bytes)  # its queue, fresh while a step runs
        except QueueFull as e:  # the HTTP side's count lagged, or its reads do: a plain 503
            self._refuse(reqs, f"the server is busy ({e}); retry shortly", "server_overloaded")
        except Unavailable as e:
            self._refuse(reqs, f"the server is not taking requests: {e}", "service_unavailable")

    def _refuse(self, reqs: list, message: str, kind: str) -> None:
        for rid, _ in reqs:
            self._emit(rid, Failed(message, 503, kind))
        self.flush(stats=True)

    def _pong(self, rid: int, fut) -> None:
        try:
            self.out.put(wire.pack(wire.PONG, id=rid, rows=fut.result()))
        except Exception as e:
            self.out.put(wire.pack(wire.PONG, id=rid, error=str(e) or type(e).__name__))


def _step(events: list, taken: list[int]) -> bytes:
    return wire.pack(wire.STEP, ev=[wire.event_out(i, ev) for i, ev in events], taken=taken)


def exit_http_lost(why: str) -> None:
    """Without its HTTP process rank 0 serves no one: end now, so that mlx.launch stops the other
    ranks and the launcher restarts the ring."""
    log.error("%s", why)
    os._exit(exits.HTTP_LOST)
