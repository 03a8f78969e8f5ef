"""Tensor mode's rank-0 handle in process: what it passes on to rank 1 and when, what it hands back,
and how many steps it keeps outstanding. The stage is a real one-rank slice; the wire to rank 1 is a
recorder (the ring itself is tested in tests/ring/test_tensor.py)."""

import mlx.core as mx
import pytest
from ringutil import make_tiny_model, reference_logits
from schedulerutil import decode_all

from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import RingError
from mlx_ring.ring.protocol import DTYPES, Header, Kind
from mlx_ring.serving.scheduler import Scheduler
from mlx_ring.tensor.lockstep import Lockstep
from shard import load_shard


class Wire:
    """Rank 0's end of a 3-rank ring: records each step it passes on (evaluated, as a send is)."""

    def __init__(self, events: list, fail: bool = False):
        self.rank, self.size, self.events, self.fail, self.handle = 0, 3, events, fail, None
        self.headers: list[Header] = []

    def send(self, header: Header, payload: mx.array | None) -> None:
        if self.fail:
            raise RuntimeError("[ring] connection to a peer was lost")
        self.headers.append(header)
        watched = self.handle.busy_since is not None
        self.events.append(
            (
                "send",
                Kind(header.kind).name,
                payload.tolist() if payload is not None else None,
                payload.dtype if payload is not None else None,
                watched,
            )
        )

    def mark(self, event: str, header: Header) -> None:
        pass


class Recording:
    def __init__(self, shard, events: list):
        self.shard, self.events = shard, events

    def apply(self, header, payload):
        self.events.append(("apply", Kind(header.kind).name))
        return self.shard.apply(header, payload)


@pytest.fixture
def tiny(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")
    return model, load_shard(model, uniform_plan(7, 1), 0)


def handle(shard, events, fail=False) -> Lockstep:
    wire = Wire(events, fail)
    # a world of one: its sums are the ids
    wire.handle = Lockstep(Recording(shard, events), wire, mx.distributed.init())
    return wire.handle


def test_a_step_goes_on_to_rank_1_before_rank_0_runs_it_and_its_own_output_comes_back(tiny):
    model, shard = tiny
    events = []
    pipe = handle(shard, events)
    prompt = [5, 17, 42, 99]
    ids = mx.array([prompt], dtype=mx.int32)
    out = pipe.round_trip(Header.for_payload(Kind.PREFILL, ids, batch=1), ids)
    # the send is watched
    assert events == [("send", "PREFILL", [prompt], mx.int32, True), ("apply", "PREFILL")]
    want, _ = reference_logits(model, prompt, steps=1)
    assert mx.allclose(shard.head(out)[0, -1], mx.array(want[0]), atol=1e-5)
    assert pipe.busy_since is None and not pipe.outstanding()


def test_sampled_ids_go_as_int32_and_decode_outputs_wait_for_settle(tiny):
    _, shard = tiny
    events = []
    pipe = handle(shard, events)
    ids = mx.array([[5, 17, 42]], dtype=mx.int32)
    pipe.round_trip(Header.for_payload(Kind.PREFILL, ids, batch=1), ids)
    pad = mx.array([0], dtype=mx.int32)
    pipe.round_trip(Header.for_payload(Kind.JOIN, pad, batch=1, group=0), pad)
    sampled = mx.array([[7]], dtype=mx.uint32)  # as argmax gives them
    pipe.submit(Header(Kind.DECODE, shape=(1, 1), dtype=DTYPES.index(mx.int32)), sampled, tag="t")
    assert events[-2] == ("send", "DECODE", [[7]], mx.int32, True)
    assert pipe.can_submit()  # a second step may be built while the first computes
    pipe.submit(Header(Kind.PING), None)
    assert not pipe.can_submit() and pipe.outstanding() == 2
    tag, out = pipe.collect()
    # handed out lazily: the caller builds on it, then settles
    assert tag == "t" and pipe.unread[1] is out
    pipe.settle()
    assert pipe.unread is None
    assert pipe.collect() == (None, None)


def test_a_lost_peer_is_a_ring_error(tiny):
    _, shard = tiny
    pipe = handle(shard, [], fail=True)
    with pytest.raises(RingError, match="ring step PING failed: .*peer was lost"):
        pipe.submit(Header(Kind.PING), None)


def test_the_scheduler_on_the_handle_decodes_what_mlx_lm_decodes(tiny):
    """Prefill, join, chained and plain decode steps, filter and free, driven through the handle."""
    model, shard = tiny
    events = []
    pipe = handle(shard, events)
    sched = Scheduler(pipe, shard, groups=1, chunk=8)
    prompts = [[5, 17, 42], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]
    got = decode_all(sched, prompts, [5] * len(prompts))
    for i, p in enumerate(prompts):
        assert got[i] == reference_logits(model, p, steps=5)[1], i
    sends = [e for e in events if e[0] == "send"]
    applies = [e for e in events if e[0] == "apply"]
    # every step went on, in the order it ran here
    assert [e[1] for e in sends] == [e[1] for e in applies]
    assert all(
        events[i][0] == "send" and events[i + 1] == ("apply", events[i][1])
        for i in range(0, len(events), 2)
    )
    assert {"PREFILL", "JOIN", "DECODE", "FILTER"} <= {e[1] for e in sends}
    # A decode step built on ids still being sampled sends its header alone: the ids
    # come in its all_sum.
    decodes = [(h, e) for h, e in zip(pipe.ring.headers, sends) if e[1] == "DECODE"]
    chained = [(h, e) for h, e in decodes if h.summed]
    assert chained and all(
        e[2] is None and h.shape == (h.shape[0], 1) and not h.carried for h, e in chained
    )
    # the first after a join: ids known here
    assert all(e[2] is not None for h, e in decodes if not h.summed)


def test_a_chained_step_settles_the_last_one_once_it_is_queued_behind_it(tiny):
    model, shard = tiny
    events = []
    pipe = handle(shard, events)
    prompt = [5, 17, 42]
    want = reference_logits(model, prompt, steps=3)[1]
    ids = mx.array([prompt], dtype=mx.int32)
    pipe.round_trip(Header.for_payload(Kind.PREFILL, ids, batch=1), ids)
    pad = mx.array([0], dtype=mx.int32)
    pipe.round_trip(Header.for_payload(Kind.JOIN, pad, batch=1, group=0), pad)
    first = mx.array([[want[0]]], dtype=mx.int32)
    pipe.submit(Header.for_payload(Kind.DECODE, first), first)
    _, out = pipe.collect()
    assert pipe.unread[1] is out
    sampled = mx.argmax(shard.head(out)[:, -1, :], axis=-1)[:, None]  # (1, 1) uint32, not evaluated
    pipe.submit(Header(Kind.DECODE), sampled, chained=True)
    header = pipe.ring.headers[-1]
    assert header.summed == 1 and header.shape == (1, 1) and events[-2][2:4] == (None, None)
    # the last step waited for (watched), the new one out
    assert pipe.unread is None and pipe.outstanding() == 1
    _, out = pipe.collect()
    assert sampled.item() == want[1] and mx.argmax(shard.head(out)[0, -1]).item() == want[2]


def test_every_host_gets_every_piece_in_tensor_mode_and_its_slice_in_a_pipeline():
    from mlx_ring.launcher.shipping import pieces_needed
    from mlx_ring.planning.plan import tensor_plan

    hosts = [("mac-a", 0), ("mac-b", 1)]
    whole = [f"layer-{i:05d}" for i in range(30)] + ["ends"]
    assert pieces_needed(tensor_plan(30, 2), hosts) == {"mac-a": whole, "mac-b": whole}
    split = pieces_needed(uniform_plan(30, 2), hosts)
    assert split == {"mac-a": whole[:15] + ["ends"], "mac-b": whole[15:30]}
    assert tensor_plan(30, 3).ranges == ((0, 30),) and tensor_plan(30, 3).size == 3
    assert [tensor_plan(30, 3).layers_of(r) for r in range(3)] == [range(0, 30)] * 3


def test_each_descriptor_leaves_before_the_last_step_is_read_and_a_stop_shows_two_later(
    tiny, monkeypatch
):
    """Steady decode in tensor mode, in the order rank 0 does things: descriptor k+1 goes to the
    workers before the first blocking wait on step k (its output or its tokens), with no payload
    (the ids ride in the step's all_sum); one read of tokens a round; a row stopped at the token
    descriptor k made leaves in descriptor k+2 (k+1 was out before that token was read)."""
    from mlx_ring.serving import runner
    from mlx_ring.serving.params import SamplingParams
    from mlx_ring.serving.scheduler import Sequence

    _, shard = tiny
    events = []
    pipe = handle(shard, events)
    wait, read = pipe._wait, runner.read_tokens

    def waited(header, out):
        events.append(("wait", Kind(header.kind).name))
        wait(header, out)

    def reading(samplers, drawn):
        events.append(("read",))
        return read(samplers, drawn)

    monkeypatch.setattr(pipe, "_wait", waited)
    monkeypatch.setattr(runner, "read_tokens", reading)
    sched = Scheduler(pipe, shard, groups=1, chunk=8)
    stop, tokens = 6, 12
    a, b = (
        Sequence(i, p, SamplingParams(temperature=0.0)) for i, p in enumerate([[5, 17], [9, 8]])
    )
    got = {0: 0, 1: 0}
    sched.add(a)
    sched.add(b)
    while not sched.idle():
        events.append(("round",))
        for s, _ in sched.step():
            got[s.id] += 1
            if got[s.id] == (stop if s is a else tokens):
                sched.remove(s)
    assert got == {0: stop, 1: tokens}
    decodes = [i for i, e in enumerate(events) if e[:2] == ("send", "DECODE")]
    waits = [i for i, e in enumerate(events) if e == ("wait", "DECODE")]
    headers = [h for h in pipe.ring.headers if h.kind == Kind.DECODE]
    assert len(decodes) == len(waits) == len(headers)
    # descriptor k+1 out before step k is waited for; the first after the join excepted
    chained = [k for k, h in enumerate(headers) if h.summed]
    assert chained == list(range(1, len(headers)))
    assert all(decodes[k] < waits[k - 1] and events[decodes[k]][2] is None for k in chained)
    # one read a round; in each round with a next step, after that step went out
    rounds = [i for i, e in enumerate(events) if e == ("round",)] + [len(events)]
    for start, end in zip(rounds, rounds[1:]):
        part = [e[:2] for e in events[start:end]]
        assert part.count(("read",)) <= 1, part
        if ("read",) in part and ("send", "DECODE") in part:
            assert part.index(("send", "DECODE")) < part.index(("read",)), part
    # a's tokens: the first from the prefill, token j from descriptor j-1 (1-based)
    rows = [h.shape[0] for h in headers]
    assert rows[:stop] == [2] * stop and rows[stop] == 1, rows
