"""The contract between rank 0's engine process and its HTTP process, which both import: the
messages that cross their socket pair (length-prefixed JSON, one kind each), how the engine's
events travel (one STEP message a round for all rows), the buffers, and the sender thread that
keeps a slow reader from ever blocking the side that writes. Plain Python, no MLX."""

import json
import logging
import socket
import struct
import threading
from collections import deque
from dataclasses import asdict, dataclass, field

from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import (
    Delta,
    Done,
    Failed,
    PrefillProgress,
    PromptCacheStats,
    Started,
    Stats,
)

log = logging.getLogger(__name__)

# engine -> HTTP
HELLO = "hello"  # what the HTTP process serves: the model, its settings, the first stats
STEP = "step"  # a round's events of every row, and the requests the engine took off its queue
STATS = "stats"  # the engine's figures (`port.Stats`), sent as they change
PONG = "pong"  # a ping's answer: one dict per rank, or why the ring could not answer
BYE = "bye"  # the engine shut down cleanly; nothing follows
# HTTP -> engine
READY = "ready"  # uvicorn listens
REFUSED = "refused"  # the HTTP server could not start (port in use?): `why`
SUBMIT = "submit"  # the choices of one API request, all or none
CANCEL = "cancel"  # rows whose client left, or whose stop string the HTTP side found
PING = "ping"  # a trip round every rank

# the command line that starts the HTTP process: `python -m HTTP_MODULE --fd N`
HTTP_MODULE = "mlx_ring.api.process"
HEADER = struct.Struct(">I")
MAX_MESSAGE = 1 << 30  # a larger length is a torn stream, not a message
# what each side asks of its socket's buffers; the OS may grant less (Linux: net.core.wmem_max)
BUFFER_BYTES = 1 << 20
# the sender's backlog past which the engine takes no new requests (a 503), so a slow HTTP side
# never holds up steps and its backlog cannot grow without bound
BACKLOG_BYTES = 64 << 20


class EngineError(Exception):
    """A ping the engine process could not answer (the ring's error, in its words)."""


@dataclass
class Token:
    """A generated token as the HTTP side holds it: the fields of `serving.sampling.Token`."""

    id: int
    logprob: float
    top: list = field(default_factory=list)


def widen(sock: socket.socket, want: int = BUFFER_BYTES) -> tuple[int, int]:
    """Ask for `want` bytes of send and receive buffer; returns what the OS granted (send, recv)."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, want)
        except OSError as e:  # a cap the OS enforces by refusing: keep its default
            log.debug("socket buffer %d bytes refused: %s", want, e)
    return tuple(
        sock.getsockopt(socket.SOL_SOCKET, o) for o in (socket.SO_SNDBUF, socket.SO_RCVBUF)
    )


def pack(kind: str, **fields) -> bytes:
    body = json.dumps({"k": kind, **fields}, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


class Reader:
    """Messages off a socket, one at a time (one thread reads)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def _exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                got = self.sock.recv(min(n - len(buf), 1 << 20))
            except OSError:
                return None
            if not got:
                return None
            buf += got
        return bytes(buf)

    def read(self) -> dict | None:
        """The next message, or None once the other side has closed (or died)."""
        head = self._exact(HEADER.size)
        if head is None:
            return None
        (n,) = HEADER.unpack(head)
        if n > MAX_MESSAGE:
            raise ValueError(f"a message of {n} bytes: the stream is torn")
        body = self._exact(n)
        return None if body is None else json.loads(body)


class Outbox:
    """Messages sent from a thread of its own: `put` never blocks, whatever the reader does.
    A message is bytes, or a callable that makes them on the sender thread."""

    def __init__(self, sock: socket.socket, name: str):
        self.sock, self.backlog = sock, 0
        self._queue: deque = deque()
        self._ready = threading.Condition()
        self.closed = False
        self.failed = False  # a send failed: the other side is gone
        self._thread = threading.Thread(target=self._send_all, name=name, daemon=True)
        self._thread.start()

    def put(self, message, size: int = 0) -> None:
        """`size`: a callable's bytes as the caller reckons them, until the sender has made them
        (counted all the while, so that a reader that stalls fills `full` however they come)."""
        size = len(message) if isinstance(message, bytes) else size
        with self._ready:
            self.backlog += size
            self._queue.append((message, size))
            self._ready.notify()

    def full(self) -> bool:
        return self.backlog > BACKLOG_BYTES

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        with self._ready:
            self.closed = True
            self._ready.notify()
        self._thread.join(timeout)

    def _send_all(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self.closed:
                    self._ready.wait()
                if not self._queue:
                    return
                message, size = self._queue.popleft()
            data = message if isinstance(message, bytes) else message()
            with self._ready:
                self.backlog += len(data or b"") - size
            try:
                if data:
                    self.sock.sendall(data)
            except OSError:
                self.failed = True
                return
            finally:
                with self._ready:
                    self.backlog -= len(data or b"")


# -- values on the wire ------------------------------------------------------------------------


def params_of(fields: dict) -> SamplingParams:
    bias = fields.get("logit_bias")
    return SamplingParams(
        **{**fields, "logit_bias": {int(k): v for k, v in bias.items()} if bias else bias}
    )


def step_bytes(events: list) -> int:
    """About the bytes a STEP of `events` takes, before the sender makes it (`event_out`)."""
    return sum(
        32 + sum(40 + 32 * len(t.top) for t in ev.tokens) if isinstance(ev, Delta) else 64
        for _, ev in events
    )


def event_out(rid: int, ev) -> list:
    """One engine event of row `rid` as it travels: tokens carry [id, logprob, top]."""
    if isinstance(ev, Delta):
        return ["t", rid, ev.cached_tokens, [[t.id, t.logprob, t.top] for t in ev.tokens]]
    if isinstance(ev, Started):
        return ["s", rid, ev.cached_tokens]
    if isinstance(ev, Done):
        return [
            "d",
            rid,
            ev.finish_reason,
            ev.prompt_tokens,
            ev.completion_tokens,
            ev.cached_tokens,
        ]
    assert isinstance(ev, Failed), ev
    return ["f", rid, ev.message, ev.status, ev.type]


def event_in(item: list) -> tuple[int, Started | Delta | Done | Failed]:
    """(row, event) from `event_out`'s form; a Delta's text is empty: the HTTP side makes it."""
    kind, rid, *rest = item
    if kind == "t":
        cached, tokens = rest
        return rid, Delta(
            "", [Token(i, lp, [tuple(a) for a in top]) for i, lp, top in tokens], cached
        )
    if kind == "s":
        return rid, Started(rest[0])
    if kind == "d":
        return rid, Done(*rest)
    return rid, Failed(*rest)


def stats_out(s: Stats) -> dict:
    return asdict(s)


def stats_in(d: dict) -> Stats:
    cache = d.get("prompt_cache")
    return Stats(
        **{
            **d,
            "prompt_cache": PromptCacheStats(**cache) if cache else None,
            "step_counts": tuple(d["step_counts"]),
            "prefills": tuple(PrefillProgress(**p) for p in d.get("prefills", ())),
        }
    )


def cluster_in(d: dict):
    """`planning.cluster.Cluster` from its `asdict` form (as HELLO carries it)."""
    from mlx_ring.planning.cluster import Cluster, PlanFacts, Planned, Prediction, RankFacts

    ranks = tuple(
        RankFacts(
            **{
                **r,
                "layers": tuple(r["layers"]),
                "planned": Planned(**r["planned"]) if r.get("planned") else None,
            }
        )
        for r in d["ranks"]
    )
    p = d["plan"]
    plan = PlanFacts(
        **{
            **p,
            "ranges": tuple(map(tuple, p["ranges"])),
            "prediction": Prediction(**p["prediction"]) if p.get("prediction") else None,
        }
    )
    return Cluster(ranks, plan)
