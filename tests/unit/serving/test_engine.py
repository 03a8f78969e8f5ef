"""The engine in process, on one rank of the default model (a ring of one: no mlx.launch
needed): one request's bad settings fail that request alone, and no request goes unanswered
when the ring fails."""

import queue
import threading
import time

import mlx.core as mx
import pytest
from mlx_lm.utils import load_tokenizer

from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import Delta, Done, Failed, QueueFull, Request, Unavailable
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard


@pytest.fixture(scope="module")
def parts(default_model):
    world = mx.distributed.init()  # a world of one: started without mlx.launch
    shard = load_shard(default_model, uniform_plan(30, 1), 0)
    return shard, Ring(world), load_tokenizer(default_model)


def make_engine(parts, **kw) -> Engine:
    shard, ring, tokenizer = parts
    engine = Engine(Scheduler(Pipeline(shard, ring), shard), tokenizer, **kw)
    engine.exits = []
    engine.exit = engine.exits.append  # a broken ring would end the process: record it instead
    return engine


class Outcome:
    """A request's events, and the moment its last one came."""

    def __init__(self, prompt, max_tokens=4, **params):
        self.events = []
        self.done = threading.Event()
        self.request = Request(prompt, max_tokens, SamplingParams(**params), emit=self.emit)

    def emit(self, ev):
        self.events.append(ev)
        if isinstance(ev, (Done, Failed)):
            self.done.set()

    def last(self):
        assert self.done.wait(120), f"no answer; events so far: {self.events}"
        return self.events[-1]


def serving(engine):
    t = threading.Thread(target=engine.run, daemon=True)
    t.start()
    return t


def stop(engine, thread):
    engine.stop()
    thread.join(60)
    assert not thread.is_alive()


def test_a_request_whose_sampling_fails_fails_alone(parts):
    engine = make_engine(parts, step_timeout=60)
    good = Outcome([1, 2, 3, 4], max_tokens=6, temperature=0.0)
    # Past the vocabulary: the API refuses this at the edge; here it reaches sampling, which must
    # fail this request only (MLX's scatter would crash the process on it).
    bad = Outcome([1, 2, 3, 5], max_tokens=6, temperature=0.0, logit_bias={99_999_999: 5.0})
    also_good = Outcome([7, 8, 9], max_tokens=3, temperature=0.0, logit_bias={42: 1.0})
    # mlx-lm checks min_p inside a compiled function that has MLX's random state as an output: its
    # error left that state broken for every later request, until the engine re-seeds it.
    bad_min_p = Outcome([4, 5, 6], max_tokens=6, temperature=1.0, min_p=1.5)
    for o in (good, bad, also_good, bad_min_p):
        engine.submit(o.request)
    t = serving(engine)
    assert isinstance(good.last(), Done) and good.last().completion_tokens == 6
    assert isinstance(also_good.last(), Done)
    failed = bad.last()
    assert (
        isinstance(failed, Failed)
        and "outside the vocabulary" in failed.message
        and failed.status == 500
    )
    assert isinstance(bad_min_p.last(), Failed) and "min_p" in bad_min_p.last().message
    # random sampling works again; the end token (2) biased away, so the draw never ends it early
    after = Outcome([1, 2], max_tokens=4, temperature=1.0, top_p=0.9, logit_bias={2: -100.0})
    engine.submit(after.request)
    assert isinstance(after.last(), Done) and after.last().completion_tokens == 4
    assert engine.broken is None and engine.exits == []
    stop(engine, t)


class SlowQueue(queue.Queue):
    """The engine's request queue, a little slow to take a request: it widens the moment
    between `submit` deciding to accept and the request being queued, where a ring failure
    used to slip in."""

    def put_nowait(self, item):
        time.sleep(0.002)
        super().put_nowait(item)


def test_no_request_is_lost_when_the_ring_fails(parts):
    # Clients keep submitting while the watchdog declares the ring broken: each request is either
    # refused at submit or answered, never queued after the engine answered the waiting ones.
    for round in range(10):
        engine = make_engine(parts)
        engine.requests = SlowQueue(10**6)
        accepted, refused, go = [], [], threading.Event()

        def client():
            go.wait()
            while True:
                o = Outcome([1, 2, 3])
                try:
                    engine.submit(o.request)
                except (Unavailable, QueueFull):
                    refused.append(o)
                    return
                accepted.append(o)

        clients = [threading.Thread(target=client) for _ in range(4)]
        for c in clients:
            c.start()
        go.set()
        while len(accepted) < 5 * (round + 1):
            time.sleep(0.001)
        engine._die("test: a peer went silent")  # as the watchdog thread calls it
        for c in clients:
            c.join(30)
        assert refused and engine.exits == [75]
        unanswered = [o for o in accepted if not o.done.is_set()]
        assert not unanswered, (
            f"round {round}: {len(unanswered)} of {len(accepted)} accepted requests never answered"
        )
        assert all(
            isinstance(o.events[-1], Failed) and "ring failure" in o.events[-1].message
            for o in accepted
        )


def test_streamed_deltas_carry_every_token_of_the_text(parts):
    engine = make_engine(parts)
    o = Outcome([1, 504, 3145, 282], max_tokens=12, temperature=0.0)
    engine.submit(o.request)
    t = serving(engine)
    done = o.last()
    deltas = [e for e in o.events if isinstance(e, Delta)]
    assert isinstance(done, Done) and sum(len(d.tokens) for d in deltas) == done.completion_tokens
    # 2: the end token
    ended = Outcome([1, 504, 3145, 282], max_tokens=12, temperature=0.0, logit_bias={2: 100.0})
    engine.submit(ended.request)
    done = ended.last()
    deltas = [e for e in ended.events if isinstance(e, Delta)]
    # the end token is counted in usage but is not in the text, so it has no entry (logprobs)
    assert (done.finish_reason, done.completion_tokens) == ("stop", 1) and [
        t.id for d in deltas for t in d.tokens
    ] == []
    stop(engine, t)


@pytest.fixture(scope="module")
def padded(default_model, tmp_path_factory):
    """A tiny random model whose vocabulary has rows past its tokenizer's (as many real models pad
    theirs), with a detokenizer that cannot turn such an id into text."""
    import json
    import shutil

    from tools.random_model import TOKENIZER_FILES, make_random_model

    tmp = tmp_path_factory.mktemp("padded")
    (tmp / "tokenizer").mkdir()
    for name in TOKENIZER_FILES:
        if (default_model / name).exists():
            shutil.copy(default_model / name, tmp / "tokenizer" / name)
    config = json.loads((default_model / "config.json").read_text())
    # 128 rows past 49152
    (tmp / "tokenizer" / "config.json").write_text(json.dumps(config | {"vocab_size": 49_280}))
    folder = make_random_model(
        "llama3-8b",
        tmp / "model",
        tmp / "tokenizer",
        dtype="float32",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    # mlx-lm's SentencePiece detokenizer (Llama 2, Mistral, Gemma tokenizers get it) has no fallback
    # for ids past its vocabulary, unlike its BPE one
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer, TokenizerWrapper

    tok = load_tokenizer(folder)
    tok = TokenizerWrapper(tok._tokenizer, SPMStreamingDetokenizer, eos_token_ids=tok.eos_token_ids)
    return load_shard(folder, uniform_plan(2, 1), 0), Ring(mx.distributed.init()), tok


def test_a_request_whose_text_cannot_be_made_fails_alone(padded):
    engine = make_engine(padded)
    good = Outcome([1, 2, 3], max_tokens=5, temperature=0.0, logit_bias={2: -100.0})
    # past the tokenizer's ids
    bad = Outcome([1, 2, 3], max_tokens=5, temperature=0.0, logit_bias={49_200: 100.0})
    for o in (good, bad):
        engine.submit(o.request)
    t = serving(engine)
    assert isinstance(good.last(), Done) and good.last().completion_tokens == 5
    assert (
        isinstance(bad.last(), Failed)
        and "text could not be made" in bad.last().message
        and bad.last().status == 500
    )
    assert engine.broken is None and engine.exits == []
    stop(engine, t)


def test_a_dying_engine_exits_even_when_it_cannot_tell_the_clients(parts):
    engine = make_engine(parts)

    def closed_loop(_):
        raise RuntimeError("Event loop is closed")

    waiting = Request([1, 2], 4, SamplingParams(), emit=closed_loop)
    engine.submit(waiting)
    engine._die("test: a peer went silent")  # as the watchdog thread calls it
    assert engine.exits == [75]


def test_pings_during_and_after_a_drain_are_answered(parts):
    engine = make_engine(parts, drain_timeout=5)
    t = serving(engine)
    assert len(engine.ping().result(30)) == 1
    engine.stop()
    t.join(60)
    assert not t.is_alive()
    # the ring has shut down: an answer at once, not a wait for the route's timeout
    late = engine.ping()
    with pytest.raises(Exception, match="shut down"):
        late.result(1)
