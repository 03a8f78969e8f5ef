"""The bridge around the real engine (one rank of the default model, no mlx.launch) and the HTTP
side's port over a socket pair: what the engine took off its queue reaches the HTTP side's count
before it computes anything for it, so a long step never turns a request away with a 503 that
the engine's queue has room for; and the answers come through as text."""

import socket
import threading
import time

import mlx.core as mx
import pytest
from mlx_lm.utils import load_tokenizer

from mlx_ring.api.remote import RemoteEngine
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving import bridge as bridge_module
from mlx_ring.serving import wire
from mlx_ring.serving.bridge import Bridge
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import Delta, Done, Request
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

STEP_S = 1.0  # each ring step and scheduling, made this long: longer than any wait below


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return load_tokenizer(default_model)


@pytest.fixture
def bridged(default_model, tokenizer, monkeypatch):
    # events left between rounds wait this long: only the rounds' own sends are seen here
    monkeypatch.setattr(bridge_module, "STRAY_S", 30.0)
    shard = load_shard(default_model, uniform_plan(30, 1), 0)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard)
    engine = Engine(sched, tokenizer, max_queue=1, max_active=1, step_timeout=60)
    slow = threading.Event()

    def slowed(run):  # a ring step, and the first chunk's compute on rank 0 as it is scheduled
        def slow_run():
            if slow.is_set():
                time.sleep(STEP_S)
            return run()

        return slow_run

    sched.step, sched.schedule = slowed(sched.step), slowed(sched.schedule)
    a, b = socket.socketpair()
    bridge = Bridge(engine, a)
    bridge.lost = lambda why: None
    remote = RemoteEngine(b, tokenizer, 1, engine.stats(), lambda clean: None)
    bridge.start({})
    assert wire.Reader(b).read()["k"] == wire.HELLO
    remote.start()
    runs = threading.Thread(target=engine.run, daemon=True)
    runs.start()
    yield engine, bridge, remote, slow
    engine.stop()
    runs.join(60)
    bridge.close()


def until(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def answer(tokenizer, text: str):
    events = []
    req = Request(tokenizer.encode(text), 3, SamplingParams(temperature=0.0), events.append)
    return req, events


def test_a_request_taken_off_the_queue_frees_its_place_before_the_step_comes_home(
    bridged, tokenizer
):
    engine, bridge, remote, slow = bridged
    slow.set()
    first, first_events = answer(tokenizer, "Hello there")
    remote.submit(first)
    assert until(lambda: any(r.sequence is not None for r in bridge.rows.values()), 5)
    # the engine's queue is empty now, its step still running: the HTTP side knows it
    assert until(lambda: not remote.queued, STEP_S / 2), "the HTTP side still counts it waiting"
    second, second_events = answer(tokenizer, "Good morning")
    remote.submit(second)  # not QueueFull: the engine's one place is free
    slow.clear()
    for events in (first_events, second_events):
        assert until(lambda e=events: e and isinstance(e[-1], Done), 120), events
        assert "".join(e.text for e in events if isinstance(e, Delta))
