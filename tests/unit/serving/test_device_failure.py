"""A GPU that fails a step ends rank 0's engine: since MLX 0.32.1 a failed Metal command buffer is
raised (once) at a later read, and what the step wrote cannot be trusted. Raised here at a token
read of the real engine (one rank of a tiny random model, in process), as MLX raises it: no row
goes on, every request in flight and every new one gets a 503, and the engine exits
DEVICE_FAILED with the line the launcher names the GPU by."""

import logging
import threading

import mlx.core as mx
import pytest
from apiutil import client, served_model
from mlx_lm.utils import load_tokenizer
from ringutil import make_tiny_model

from mlx_ring import exits
from mlx_ring.launcher.failures import explain
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving import runner, sampling
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.port import Delta, Done, Failed, Request, Unavailable
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

# MLX's words (mlx/backend/metal/device.cpp), with Metal's description of the watchdog's error
METAL_TIMEOUT = (
    "[METAL] Command buffer execution failed: Caused GPU Timeout Error "
    "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)."
)
FAILED = f"the GPU failed on rank 0: {METAL_TIMEOUT}"


@pytest.fixture(scope="module")
def parts(default_model, tmp_path_factory):
    tiny = make_tiny_model(tmp_path_factory.mktemp("gpu") / "model", "llama", vocab_size=49152)
    tokenizer = load_tokenizer(default_model)
    return tiny, Ring(mx.distributed.init()), tokenizer, served_model(default_model, tokenizer)


@pytest.fixture
def engine(parts):
    tiny, ring, tokenizer, _ = parts
    shard = load_shard(tiny, uniform_plan(7, 1), 0)  # its own: a failed engine frees nothing
    engine = Engine(Scheduler(Pipeline(shard, ring), shard), tokenizer)
    engine.exits = []
    engine.exit = engine.exits.append  # the process would end: record it instead
    engine.events = []  # every request's events and the failure, in the order they came
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    yield engine
    engine.stop()
    thread.join(60)
    assert not thread.is_alive(), "the engine thread did not end"


def fail_once(engine, module, name: str, after: int):
    """Replace `module.name` (a token read) by one that raises MLX's error on its call after
    `after` calls, once, as MLX raises a failed command buffer's error once."""
    real, calls = getattr(module, name), []

    def read(*args):
        calls.append(1)
        if len(calls) == after + 1:
            engine.events.append("failed")
            raise RuntimeError(METAL_TIMEOUT)
        return real(*args)

    return read


class Outcome:
    def __init__(self, engine, prompt, **params):
        self.events, self.done = [], threading.Event()
        self.engine = engine
        self.request = Request(prompt, 40, SamplingParams(**params), emit=self.emit)

    def emit(self, ev):
        self.events.append(ev)
        self.engine.events.append(ev)
        if isinstance(ev, (Done, Failed)):
            self.done.set()

    def last(self):
        assert self.done.wait(120), f"no answer; events so far: {self.events}"
        return self.events[-1]


def assert_ended(engine, caplog) -> None:
    """No token after the failure, the engine gone with DEVICE_FAILED, new requests refused, and
    the line the launcher names the rank's GPU by."""
    after = engine.events[engine.events.index("failed") :]
    assert not any(isinstance(e, Delta) for e in after), after
    assert engine.exits == [exits.DEVICE_FAILED]
    with pytest.raises(Unavailable, match="the GPU failed on rank 0"):
        engine.submit(Request([1, 2], 4, SamplingParams(), emit=lambda ev: None))
    assert FAILED in engine.stats().broken  # /health answers 503 with it
    assert exits.gpu_failures(caplog.text) == {0: METAL_TIMEOUT}
    [said] = explain(caplog.text, ["127.0.0.1"])
    assert said.startswith("rank 0: the GPU failed a command buffer (kIOGPUCommandBufferCallback")


def test_a_gpu_failure_at_the_batched_read_of_chained_steps_ends_the_engine(
    engine, monkeypatch, caplog
):
    # greedy rows sample in one call, read after the group's next step went out on the ids
    monkeypatch.setattr(runner, "read_tokens", fail_once(engine, runner, "read_tokens", 3))
    rows = [Outcome(engine, [1, 2, 3 + i], temperature=0.0) for i in range(3)]
    with caplog.at_level(logging.ERROR):
        for o in rows:
            engine.submit(o.request)
        ends = [o.last() for o in rows]
    assert all(
        e.status == 503 and e.type == "service_unavailable" and FAILED in e.message for e in ends
    ), ends
    assert_ended(engine, caplog)


def test_a_gpu_failure_at_one_rows_own_read_fails_every_request_with_a_503_not_that_row_a_500(
    engine, parts, monkeypatch, caplog
):
    # a row with a logit bias builds its sampling alone, each caught alone: the GPU's error must
    # not pass as that row's own failure while the others decode on
    monkeypatch.setattr(sampling, "_alone", fail_once(engine, sampling, "_alone", 4))
    biased = {"logit_bias": {"42": 1.0}, "temperature": 0.0, "max_tokens": 40}
    other = Outcome(engine, [5, 6, 7], temperature=0.0, logit_bias={43: 1.0})
    with caplog.at_level(logging.ERROR), client(engine, parts[3]) as http:
        engine.submit(other.request)
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]} | biased
        )
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["type"] == "service_unavailable" and FAILED in error["message"], error
        assert other.last().status == 503 and FAILED in other.last().message
        # a request that comes after: refused at once, as the server's other 503s
        late = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}
        )
        assert late.status_code == 503 and FAILED in late.json()["error"]["message"], late.text
    assert_ended(engine, caplog)
