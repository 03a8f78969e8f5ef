"""The real engine through the port the API uses (serving/port.py), on one rank of the default model
(a ring of one: no mlx.launch): what `stats()` and `ping()` report, what `cancel()` does, and the
news of a prompt's prefill."""

import threading
import time

import mlx.core as mx
import pytest
from mlx_lm.utils import load_tokenizer

from mlx_ring.cache.blocks import BlockIndex
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import Done, EnginePort, Failed, PrefillProgress, Request, Started
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard


@pytest.fixture(scope="module")
def engine(default_model):
    shard = load_shard(default_model, uniform_plan(30, 1), 0)
    world = mx.distributed.init()  # a world of one: started without mlx.launch
    engine: EnginePort = Engine(
        Scheduler(Pipeline(shard, Ring(world)), shard, prefix=BlockIndex(4096, block=16)),
        load_tokenizer(default_model),
    )
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    yield engine
    engine.stop()
    thread.join(60)


def ask(engine, prompt, max_tokens) -> tuple[Request, list, threading.Event]:
    events, done = [], threading.Event()

    def emit(ev):
        events.append(ev)
        if isinstance(ev, (Done, Failed)):
            done.set()

    req = Request(prompt, max_tokens, SamplingParams(temperature=0.0), emit=emit)
    engine.submit(req)
    return req, events, done


def test_stats_and_ping_report_the_steps_taken(engine):
    start = engine.stats()
    assert (start.queued, start.active, start.broken, start.serving) == (0, 0, None, True)
    _, events, done = ask(engine, list(range(1, 40)), 5)
    assert done.wait(120) and isinstance(events[-1], Done) and events[-1].completion_tokens == 5
    s = engine.stats()
    steps = sum(s.step_counts) - sum(start.step_counts)
    # a prefill step and one per token at least
    assert steps >= 5 and s.step_seconds > start.step_seconds
    assert (
        s.prompt_cache.entries == 3  # blocks of 16 tokens: 44 tokens
        and s.prompt_cache.budget_tokens == 4096
        and s.prompt_cache.tokens > 39
    )
    assert (s.draft_tokens, s.drafted, s.accepted) == (0, 0, 0)
    [row] = engine.ping().result(60)
    # rank 0's busy time is the engine's time in ring steps, as of the ping's own step
    assert int(s.step_seconds * 100) <= row["busy_cs"] <= int(engine.stats().step_seconds * 100)
    assert row["rank"] == 0 and row["prompt_cache_entries"] == s.prompt_cache.entries


def test_cancel_fails_a_running_request_and_frees_it(engine):
    req, events, done = ask(engine, [1, 2, 3], 10_000)
    deadline = time.monotonic() + 60
    while not events:  # until it generates
        assert time.monotonic() < deadline, "no token within 60 s"
        done.wait(0.01)
    engine.cancel(req)
    assert done.wait(60) and events[-1] == Failed("cancelled by the client", 499, "cancelled")
    assert engine.stats().active == 0


def test_a_prompt_hears_when_its_prefill_begins_and_stats_show_its_progress(engine):
    """Started comes first, once the prompt's cached start is known; at that moment `stats()`
    shows the prompt prefilling, from that start."""
    prompt = list(range(100, 300))

    def started(prompt) -> tuple[list, list]:
        events, at_start, done = [], [], threading.Event()

        def emit(ev):
            if isinstance(ev, Started):
                at_start.append(engine.stats().prefills)
            events.append(ev)
            if isinstance(ev, (Done, Failed)):
                done.set()

        engine.submit(Request(prompt, 3, SamplingParams(temperature=0.0), emit=emit))
        assert done.wait(120) and isinstance(events[-1], Done), events
        return events, at_start

    events, [shown] = started(prompt)
    assert events[0] == Started(0) and not any(isinstance(e, Started) for e in events[1:])
    assert shown == (PrefillProgress(len(prompt), 0, 0),)
    # the same start again: the prompt cache holds it, and the prefill starts from there
    longer = prompt + list(range(400, 500))
    events, [shown] = started(longer)
    cached = events[0].cached_tokens
    assert 0 < cached <= len(prompt) and events[-1].cached_tokens == cached
    assert shown == (PrefillProgress(len(longer), cached, cached),)
