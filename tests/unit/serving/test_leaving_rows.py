"""A row that leaves its decode group while the ring has no room (two ranks: one step in flight,
calls waiting behind it) is saved in the prompt cache as its cache stood when it left: the group's
next step, chained on the ids just sampled, waits for that save instead of going first. Rank 0 of
a ring of two, in process: its second rank hands each step straight back."""

from collections import deque

import mlx.core as mx
import pytest
from ringutil import make_tiny_model

from mlx_ring.cache.blocks import BlockIndex
from mlx_ring.cache.held import HeldBlocks
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Kind
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.scheduler import Scheduler, Sequence
from shard import load_shard

BLOCK = 4


class Loopback:
    """Rank 0's wire on a ring of two whose rank 1 has no layers: each step comes back as sent,
    so the pipeline keeps its rules for a ring (one step in flight, the rest wait for room)."""

    rank, size, control = 0, 2, None

    def __init__(self):
        self.sent: deque = deque()
        self.kinds: list[Kind] = []

    def send_header(self, header, out) -> None:
        self.kinds.append(Kind(header.kind))

    def send_payload(self, header, out) -> None:
        if out is not None:
            mx.eval(out)
        self.sent.append((header, out))

    def recv(self, lazy: bool = False):
        return self.sent.popleft()

    def wait_payload(self) -> None:
        pass

    def mark(self, event: str, header) -> None:
        pass


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "m", "llama")


@pytest.fixture
def shard(model):
    shard = load_shard(model, uniform_plan(7, 1), 0)
    shard.held = HeldBlocks(0)
    return shard


@pytest.mark.parametrize("calls", [0, 1, 2, 3])
def test_a_row_leaving_behind_calls_is_saved_as_it_left(shard, calls):
    wire = Loopback()
    sched = Scheduler(
        Pipeline(shard, wire), shard, groups=1, chunk=8, prefix=BlockIndex(1 << 20, block=BLOCK)
    )
    prompt = [5, 17, 42, 99, 3, 250, 7, 11, 13]
    seq = Sequence(0, prompt, SamplingParams(temperature=0.0))
    sched.add(seq)
    got = 0
    while not sched.idle():
        for s, _ in sched.step():
            got += 1
            if got == 6:
                # calls the HTTP side asked for meanwhile (a page polling the ring's status)
                for _ in range(calls):
                    sched.ping(lambda _: None)
                sched.remove(s)  # its save checks the tokens its cache holds on every rank
    kept = [k for k in wire.kinds if k == Kind.SAVE_ROW]
    assert len(kept) == 1 and got >= 6
    # the prompt and the answer as far as the row's cache held them: a turn that resends them
    # finds all but its last token
    held = seq.sampler.history[: len(prompt) + seq.fed]
    assert sched.prefix.lookup(held + [1]).tokens == len(held)
