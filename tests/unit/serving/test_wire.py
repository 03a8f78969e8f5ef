"""The engine process and its HTTP process, in one test process: their framing, a writer that
never blocks on a reader that does not read (an 8 KiB socket, as macOS gives), and the port over
the socket: tokens from the engine side come out as the text a client sees, a stop string found
on the HTTP side cancels the row, the queue's bound is a synchronous QueueFull, pings and stats
cross, and an engine that goes fails what was open. Also: the HTTP process imports no MLX."""

import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest
from mlx_lm.utils import load_tokenizer

from mlx_ring.api.remote import RemoteEngine
from mlx_ring.serving import wire
from mlx_ring.serving.bridge import Bridge
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import Delta, Done, Failed, QueueFull, Request, Started, Stats


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return load_tokenizer(default_model)


def stats(active: int = 0) -> Stats:
    return Stats(0, active, None, False, None, 0, 0, 0, (0,) * 13, 0.0)


class StandIn:
    """The engine's port as the bridge drives it; the test plays the engine thread."""

    def __init__(self, max_queue: int = 2):
        self.got: list[Request] = []
        self.cancelled: list[Request] = []
        self.max_queue = max_queue
        self.detokenize, self.after_round = True, None

    def submit(self, *reqs):
        self.got += reqs

    def cancel(self, *reqs):
        self.cancelled += reqs

    def ping(self):
        fut = Future()
        fut.set_result([{"rank": 0, "sequences": len(self.got)}])
        return fut

    def stats(self):
        return stats(len(self.got))


def until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.fixture
def pair(tokenizer):
    a, b = socket.socketpair()
    engine, ended = StandIn(), []
    bridge = Bridge(engine, a)
    bridge.lost = lambda why: ended.append(why)
    remote = RemoteEngine(b, tokenizer, engine.max_queue, stats(), ended.append)
    bridge.start({})
    assert wire.Reader(b).read()["k"] == wire.HELLO
    remote.start()
    yield engine, bridge, remote, ended
    a.close()
    b.close()


def request(tokenizer, stop=(), max_tokens=50):
    events = []
    req = Request(tokenizer.encode("Hi"), max_tokens, SamplingParams(), events.append, list(stop))
    return req, events


def test_framing_round_trips_and_a_closed_socket_reads_none():
    a, b = socket.socketpair()
    a.sendall(wire.pack(wire.STEP, ev=[["t", 1, 0, [[5, -0.25, [[6, -1.5]]]]]], taken=[1]))
    msg = wire.Reader(b).read()
    assert wire.event_in(msg["ev"][0]) == (1, Delta("", [wire.Token(5, -0.25, [(6, -1.5)])], 0))
    a.close()
    assert wire.Reader(b).read() is None


def test_a_reader_that_does_not_read_never_blocks_the_writer():
    a, b = socket.socketpair()
    for s in (a, b):  # as small as macOS's socket pairs
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 8192
    out = wire.Outbox(a, "test")
    for i in range(200):  # 10 MB that nobody reads yet: a put that waited would stop here
        out.put(wire.pack(wire.STEP, ev=[], taken=[i], pad="x" * 50_000))
    assert out.backlog > 1 << 20
    reader = wire.Reader(b)
    assert [reader.read()["taken"] for _ in range(200)] == [[i] for i in range(200)]
    until(lambda: out.backlog == 0)


def test_http_side_buffers_are_asked_for_and_reported():
    a, _ = socket.socketpair()
    granted = wire.widen(a)
    assert all(g >= 8192 for g in granted)


def test_tokens_become_text_and_the_engine_end_passes_on(pair, tokenizer):
    engine, bridge, remote, _ = pair
    assert engine.detokenize is False and engine.after_round == bridge.flush
    req, events = request(tokenizer)
    remote.submit(req)
    until(lambda: engine.got)
    engine.got[0].emit(Started(3))
    ids = tokenizer.encode("Bonjour à tous")
    for tid in ids:
        engine.got[0].emit(Delta("", [wire.Token(tid, -0.5, [])], 3))
        engine.after_round()
    engine.got[0].emit(Done("length", 2, len(ids), 3))
    engine.after_round()
    until(lambda: events and isinstance(events[-1], Done))
    assert isinstance(events[0], Started) and events[0].cached_tokens == 3
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "Bonjour à tous"
    assert events[-1] == Done("length", 2, len(ids), 3)
    assert [t.id for e in events if isinstance(e, Delta) for t in e.tokens] == ids


def test_a_stop_string_found_on_the_http_side_cancels_the_row(pair, tokenizer):
    engine, _, remote, _ = pair
    req, events = request(tokenizer, stop=["world"])
    remote.submit(req)
    until(lambda: engine.got)
    for tid in tokenizer.encode("hello world and more"):
        engine.got[0].emit(Delta("", [wire.Token(tid, -0.5, [])], 0))
        engine.after_round()
    until(lambda: engine.cancelled)
    assert engine.cancelled == engine.got
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 1 and done[0].finish_reason == "stop" and done[0].stop_sequence == "world"
    assert "".join(e.text for e in events if isinstance(e, Delta)) == "hello "


def test_the_queue_bound_is_a_synchronous_queue_full_until_the_engine_takes_them(pair, tokenizer):
    engine, _, remote, _ = pair
    remote.submit(request(tokenizer)[0], request(tokenizer)[0])
    with pytest.raises(QueueFull):
        remote.submit(request(tokenizer)[0])
    until(lambda: len(engine.got) == 2)
    engine.got[0].sequence = engine.got[1].sequence = object()  # taken off the queue
    engine.after_round()
    until(lambda: not remote.queued)
    remote.submit(request(tokenizer)[0])


def test_pings_and_stats_cross(pair, tokenizer):
    engine, _, remote, _ = pair
    remote.submit(request(tokenizer)[0])
    until(lambda: engine.got)
    engine.got[0].emit(Started(0))
    engine.after_round()
    until(lambda: remote.stats().active == 1)
    assert remote.ping().result(5) == [{"rank": 0, "sequences": 1}]


def test_a_cancel_from_the_client_reaches_the_engine(pair, tokenizer):
    engine, _, remote, _ = pair
    req, _ = request(tokenizer)
    remote.submit(req)
    until(lambda: engine.got)
    remote.cancel(req)
    until(lambda: engine.cancelled == engine.got)


def test_an_engine_that_goes_fails_what_is_open_and_ends_the_http_side(pair, tokenizer):
    engine, bridge, remote, ended = pair
    req, events = request(tokenizer)
    remote.submit(req)
    until(lambda: engine.got)
    bridge.sock.shutdown(socket.SHUT_RDWR)
    until(lambda: False in ended)
    assert isinstance(events[-1], Failed) and events[-1].status == 503
    with pytest.raises(Exception):
        remote.submit(request(tokenizer)[0])


def test_an_http_side_that_goes_is_named_on_the_engine_side(pair):
    _, _, remote, ended = pair
    remote.sock.shutdown(socket.SHUT_RDWR)
    until(lambda: any(isinstance(e, str) and "HTTP process" in e for e in ended))


def test_the_http_process_imports_no_mlx(default_model):
    code = (
        "import sys, mlx_ring.api.process, mlx_ring.api.app, mlx_ring.api.remote, uvicorn;"
        "from mlx_ring.api.tokenizer import load_tokenizer, GrammarCheck;"
        f"t = load_tokenizer({str(default_model)!r}, [], None); GrammarCheck(t, 49152);"
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True);"
        "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_bridge_sends_one_step_for_all_rows_of_a_round(tokenizer):
    a, b = socket.socketpair()
    engine = StandIn(max_queue=8)
    bridge = Bridge(engine, a)
    bridge.lost = lambda why: None
    bridge.start({})
    reader = wire.Reader(b)
    assert reader.read()["k"] == wire.HELLO
    b.sendall(
        wire.pack(
            wire.SUBMIT,
            reqs=[
                {"id": i, "prompt": [1], "max_tokens": 4, "params": {}, "after": None}
                for i in (1, 2, 3)
            ],
        )
    )
    until(lambda: len(engine.got) == 3)
    for r in engine.got:
        r.emit(Delta("", [wire.Token(7, -0.1, [])], 0))
    engine.after_round()
    steps = []
    while not steps:
        msg = reader.read()
        if msg["k"] == wire.STEP:
            steps.append(msg)
    assert [e[1] for e in steps[0]["ev"]] == [1, 2, 3]
    threading.Thread(target=a.close).start()


def small_buffers(*socks, size=8192):
    """As small as macOS's socket pairs are by default (Linux gives some 208 KiB)."""
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def test_long_answers_through_8_kib_buffers_never_block_the_engine_and_all_arrive(tokenizer):
    a, b = socket.socketpair()
    small_buffers(a, b)
    engine, rows, steps = StandIn(max_queue=8), 6, 1500
    bridge = Bridge(engine, a)
    bridge.lost = lambda why: None
    remote = RemoteEngine(b, tokenizer, engine.max_queue, stats(), lambda clean: None)
    bridge.start({})
    assert wire.Reader(b).read()["k"] == wire.HELLO
    remote.start()
    seen = [[] for _ in range(rows)]

    def slow(i):  # the HTTP side's loop, slower than the engine: the socket fills up
        return lambda ev: (seen[i].append(ev), time.sleep(0.0002))

    for i in range(rows):
        remote.submit(Request([1], steps, SamplingParams(), slow(i)))
    until(lambda: len(engine.got) == rows)
    text = " ".join(f"line {n} of the tale, with some words of its own;" for n in range(400))
    ids = tokenizer.encode(text)[:steps]
    most = 0
    for tid in ids:
        for r in engine.got:
            r.sequence = r.sequence or object()
            top = [(tid + k, -1.0 - k) for k in range(1, 6)]
            r.emit(Delta("", [wire.Token(tid, -0.5, top)], 0))
        engine.after_round()
        most = max(most, bridge.out.backlog)
    for r in engine.got:
        r.emit(Done("length", 1, len(ids), 0))
    engine.after_round()
    until(lambda: all(ev and isinstance(ev[-1], Done) for ev in seen), timeout=60)
    # the reader fell far behind: a backlog many times the socket's, which a step that waited on
    # the socket could never build
    assert most > 16 * 8192, most
    for events in seen:
        assert [t.id for e in events if isinstance(e, Delta) for t in e.tokens] == ids
        assert "".join(e.text for e in events if isinstance(e, Delta)) == tokenizer.decode(ids)
    until(lambda: bridge.out.backlog == 0)


def test_a_reader_that_stalls_turns_new_requests_away_not_the_steps(tokenizer, monkeypatch):
    """Back-pressure goes to admission: the steps still leave at once, queued for the sender,
    and once that queue passes its bound a new request is a 503, sent when the reader reads."""
    monkeypatch.setattr(wire, "BACKLOG_BYTES", 256 << 10)
    a, b = socket.socketpair()
    small_buffers(a, b)
    engine = StandIn(max_queue=8)
    bridge = Bridge(engine, a)
    bridge.lost = lambda why: None
    bridge.start({})
    item = {"prompt": [1], "max_tokens": 9999, "params": {}, "after": None}
    b.sendall(wire.pack(wire.SUBMIT, reqs=[item | {"id": 1}]))
    until(lambda: engine.got)
    sent, handled = [], threading.Event()

    def steps():  # a step that waited on the socket would hang here: nobody reads b
        while not handled.is_set():
            assert len(sent) < 200_000, "the sender's backlog does not count the steps it holds"
            engine.got[0].emit(Delta("", [wire.Token(7, -0.5, [(8, -1.0)] * 5)], 0))
            engine.after_round()
            sent.append(1)

    stepping = threading.Thread(target=steps, daemon=True)
    stepping.start()
    until(bridge.out.full, timeout=60)
    # the second request comes while the steps go on filling the backlog, which nothing reads
    submit = bridge._submit
    bridge._submit = lambda items: (submit(items), handled.set())
    b.sendall(wire.pack(wire.SUBMIT, reqs=[item | {"id": 2}]))
    assert handled.wait(60)
    stepping.join(60)
    assert not stepping.is_alive(), f"the steps waited on the socket after {len(sent)}"
    b.settimeout(60)  # what never comes fails the test instead of hanging it
    reader, tokens, refused = wire.Reader(b), 0, None
    while refused is None or tokens < len(sent):
        msg = reader.read()
        assert msg is not None, (tokens, len(sent), refused)
        for e in msg.get("ev", []) if msg["k"] == wire.STEP else []:
            tokens += e[0] == "t" and e[1] == 1
            refused = wire.event_in(e)[1] if e[0] == "f" and e[1] == 2 else refused
    assert len(engine.got) == 1 and tokens == len(sent)
    assert refused.status == 503 and refused.type == "server_overloaded"
    a.close()
