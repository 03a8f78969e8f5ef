"""The engine as the HTTP process sees it: `port.EnginePort` over the socket to rank 0's engine
process (serving/wire.py, serving/bridge.py). The engine sends tokens; each row's text (streaming
detokenization, stop strings) is made here, and a stop string found here cancels the row on every
rank. Admission is counted here against the engine's queue, so a full queue is a plain 503."""

import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Callable

from mlx_ring.serving import wire
from mlx_ring.serving.port import Delta, Done, Failed, QueueFull, Request, Stats, Unavailable
from mlx_ring.serving.textstream import TextStream

log = logging.getLogger(__name__)


class Row:
    """One request's answer on the HTTP side: its text so far, made from the engine's tokens."""

    def __init__(self, rid: int, req: Request, detokenizer):
        self.rid, self.req = rid, req
        self.text = TextStream(detokenizer, req.stop)
        self.count = 0

    def tokens(self, delta: Delta) -> bool:
        """Emit the text these tokens make; True where a stop string ended the answer."""
        for tok in delta.tokens:
            self.count += 1
            self._send(self.text.add(tok.id, tok), delta.cached_tokens)
            if self.text.closed:
                prompt = len(self.req.prompt)
                self.req.emit(
                    Done("stop", prompt, self.count, delta.cached_tokens, self.text.stop_hit)
                )
                return True
        return False

    def done(self, done: Done) -> None:
        """The engine ended the answer (end token, length): flush the text, then the end."""
        self._send(self.text.end(), done.cached_tokens)
        if done.finish_reason == "length" and self.text.stop_hit:
            done.finish_reason, done.stop_sequence = "stop", self.text.stop_hit
        self.req.emit(done)

    def _send(self, piece, cached: int) -> None:
        if piece is not None:
            self.req.emit(Delta(piece.text, piece.tokens, cached))


class RemoteEngine:
    """`EnginePort` over the engine process's socket; `tokenizer`: mlx-lm's wrapper (each row
    gets a detokenizer of its own from it); `max_queue`: the engine's queue bound."""

    def __init__(self, sock, tokenizer, max_queue: int, stats: Stats, on_end: Callable):
        """`on_end(clean)`: the engine's socket closed, after its BYE (clean) or without one."""
        self.sock, self.tokenizer, self.max_queue = sock, tokenizer, max_queue
        self.latest = stats
        self.on_end = on_end
        self.out = wire.Outbox(sock, "to-engine")
        self.ids = itertools.count(1)
        self.rows: dict[int, Row] = {}
        self.by_req: dict[Request, int] = {}
        self.queued: set[int] = set()  # submitted, not yet taken off the engine's queue
        self.pings: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._ended: str | None = None
        self._reader = threading.Thread(target=self._read_all, name="from-engine", daemon=True)

    def start(self) -> None:
        self._reader.start()

    def send(self, kind: str, **fields) -> None:
        self.out.put(wire.pack(kind, **fields))

    # -- EnginePort, on the event loop -------------------------------------------------------------
    def submit(self, *reqs: Request) -> None:
        s = self.latest
        if self._ended or not s.serving:
            raise Unavailable(self._ended or s.broken or "the server is shutting down")
        with self._lock:
            if len(self.queued) + len(reqs) > self.max_queue:
                raise QueueFull(
                    f"{len(self.queued)} requests are already waiting (at most {self.max_queue})"
                )
            items = []
            for req in reqs:
                rid = next(self.ids)
                self.rows[rid], self.by_req[req] = Row(rid, req, self.tokenizer.detokenizer), rid
                self.queued.add(rid)
                items.append(
                    {
                        "id": rid,
                        "prompt": req.prompt,
                        "max_tokens": req.max_tokens,
                        "params": req.params.__dict__,
                        "after": self.by_req.get(req.after) if req.after is not None else None,
                    }
                )
        self.send(wire.SUBMIT, reqs=items)

    def cancel(self, *reqs: Request) -> None:
        ids = []
        with self._lock:
            for r in reqs:
                r.cancelled.set()
                if (rid := self.by_req.get(r)) is not None:
                    ids.append(rid)
        if ids:
            self.send(wire.CANCEL, ids=ids)

    def stats(self) -> Stats:
        return self.latest

    def ping(self) -> Future:
        fut: Future = Future()
        if self._ended:
            fut.set_exception(wire.EngineError(self._ended))
            return fut
        rid = next(self.ids)
        self.pings[rid] = fut
        self.send(wire.PING, id=rid)
        return fut

    # -- the reader thread -------------------------------------------------------------------------
    def _read_all(self) -> None:
        reader, clean = wire.Reader(self.sock), False
        try:
            while (msg := reader.read()) is not None:
                if msg["k"] == wire.BYE:
                    clean = True
                    break
                self._handle(msg)
        except Exception:
            log.exception("a message from the engine process could not be read")
        self._end(clean)

    def _handle(self, msg: dict) -> None:
        kind = msg["k"]
        if kind == wire.STEP:
            for item in msg["ev"]:
                self._event(*wire.event_in(item))
            with self._lock:
                self.queued.difference_update(msg["taken"])
        elif kind == wire.STATS:
            self.latest = wire.stats_in(msg["stats"])
        elif kind == wire.PONG:
            fut = self.pings.pop(msg["id"], None)
            if fut is not None and fut.set_running_or_notify_cancel():
                if "error" in msg:
                    fut.set_exception(wire.EngineError(msg["error"]))
                else:
                    fut.set_result(msg["rows"])
        else:
            log.warning("the engine process sent a message of unknown kind %r", kind)

    def _event(self, rid: int, ev) -> None:
        with self._lock:
            self.queued.discard(rid)
            row = self.rows.get(rid)
        if row is None:  # ended here already (a stop string): what the engine made since is moot
            return
        try:
            if isinstance(ev, Delta):
                if row.tokens(ev):
                    self._forget(row)
                    self.send(wire.CANCEL, ids=[rid])
            elif isinstance(ev, Done):
                self._forget(row)
                row.done(ev)
            elif isinstance(ev, Failed):
                self._forget(row)
                row.req.emit(ev)
            else:
                row.req.emit(ev)
        except Exception as e:  # its text (detokenizer, stop strings) failed: this request alone
            log.exception("request %d: its text could not be made", rid)
            self._forget(row)
            self.send(wire.CANCEL, ids=[rid])
            row.req.emit(
                Failed(
                    f"the answer's text could not be made: {type(e).__name__}: {e}",
                    500,
                    "server_error",
                )
            )

    def _forget(self, row: Row) -> None:
        with self._lock:
            self.rows.pop(row.rid, None)
            self.by_req.pop(row.req, None)

    def _end(self, clean: bool) -> None:
        """The engine process is gone: fail what is still open, then let the process end."""
        why = "the server has shut down" if clean else "rank 0's engine process ended"
        self._ended = why
        with self._lock:
            rows, self.rows, self.by_req = list(self.rows.values()), {}, {}
            pings, self.pings = list(self.pings.values()), {}
        for row in rows:
            row.req.emit(Failed(why, 503, "service_unavailable"))
        for fut in pings:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(wire.EngineError(why))
        self.on_end(clean)
