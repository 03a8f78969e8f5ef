"""Decode steps chained whatever the rows ask: a group's next step goes out on the ids just sampled,
before they are read, with seeds, penalties, a logit bias, alternatives, a grammar or rows at other
temperatures in the group, and every row draws what it draws when each step waits for its read."""

import json
import random

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors
from mlx_lm.utils import load_model, load_tokenizer
from ringutil import make_tiny_model

from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.params import SamplingParams as P
from mlx_ring.serving.sampling import CONTEXT
from mlx_ring.serving.scheduler import Scheduler, Sequence
from shard import load_shard

# one length: the prompts prefill in one batch and join their group together
PROMPTS = [[5, 17, 42], [9, 8, 7], [250, 3, 4], [100, 101, 102]]
TOKENS = 32
SCENARIOS = {
    "seed": [P(temperature=0.8, seed=5), P(temperature=0.8, seed=6, top_k=20), P(temperature=0.0)],
    "penalties": [
        P(temperature=0.0, repetition_penalty=1.3),
        P(temperature=0.0, presence_penalty=0.5),
        P(temperature=0.0, frequency_penalty=0.7),
    ],
    "logit_bias": [P(temperature=0.0, logit_bias={3: 2.0, 17: -1.0}), P(temperature=0.0)],
    "top_logprobs": [P(temperature=0.0, top_logprobs=3), P(temperature=0.0)],
    "mixed temperatures": [
        P(temperature=0.0),
        P(temperature=0.7, top_p=0.9, seed=1),
        P(temperature=1.2, top_k=20, seed=2),
        P(temperature=0.0, logprobs=False),
    ],
    # unseeded: drawn from MLX's global state, which a row that left moves once more (its next
    # step was out already): only the share of chained steps is compared
    "two temperatures": [P(temperature=0.7), P(temperature=1.3, top_k=40), P(temperature=0.7)],
    "everything at once": [
        P(temperature=0.9, seed=11, top_k=30, top_p=0.9, repetition_penalty=1.2, logprobs=False),
        P(temperature=0.5, seed=12, min_p=0.05, top_logprobs=4, logit_bias={5: 3.0}),
        P(temperature=0.0, presence_penalty=0.4, top_logprobs=2, frequency_penalty=0.2),
        P(temperature=0.0),
    ],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "m", "llama")


@pytest.fixture(scope="module")
def shard(tiny):
    return load_shard(tiny, uniform_plan(7, 1), 0)


def decode(shard, params, chain=True, constrain=None, end=()):
    """Each row's tokens (id, logprob, alternatives) and the share of steady decode steps (those
    that follow a decode step: not the first after a join) that went out chained."""
    pipe = Pipeline(shard, Ring(mx.distributed.init()))
    sched = Scheduler(pipe, shard, groups=1, chunk=8)
    if not chain:
        sched._may_chain = lambda g, rows: False  # every step waits for the last one's read
    kinds, submit = [], pipe.submit

    def noting(header, payload, tag=None, chained=False):
        kinds.append((header.kind, chained))
        return submit(header, payload, tag, chained)

    pipe.submit = noting
    seqs = [Sequence(i, PROMPTS[i], p, constrain=constrain) for i, p in enumerate(params)]
    got = {s.id: [] for s in seqs}
    for s in seqs:
        sched.add(s)
    while not sched.idle():
        for s, t in sched.step():
            assert not isinstance(t, Exception), t
            got[s.id].append((t.id, t.logprob, t.top))
            if len(got[s.id]) == TOKENS or t.id in end:
                sched.remove(s)
    steady = [c for (k0, _), (k, c) in zip(kinds, kinds[1:]) if k0 == k == Kind.DECODE]
    return [got[s.id] for s in seqs], sum(steady) / len(steady)


def same(a, b):
    """Equal tokens and alternatives, and log-probabilities equal but for float rounding (NaN,
    for one not asked, equal to NaN): a graph built whole or in parts may sum in another order."""

    def close(x, y):
        return (x != x and y != y) or abs(x - y) <= 1e-4

    def row_same(r, q):
        return len(r) == len(q) and all(
            i == j
            and close(lp, lq)
            and [t for t, _ in top] == [u for u, _ in tq]
            and all(close(v, w) for (_, v), (_, w) in zip(top, tq))
            for (i, lp, top), (j, lq, tq) in zip(r, q)
        )

    return len(a) == len(b) and all(row_same(r, q) for r, q in zip(a, b))


@pytest.mark.parametrize("name", SCENARIOS)
def test_decode_steps_chain_whatever_the_rows_ask_with_the_tokens_of_unchained_steps(shard, name):
    chained, share = decode(shard, SCENARIOS[name])
    unchained, none = decode(shard, SCENARIOS[name], chain=False)
    assert share >= 0.95 and none == 0, (name, share)
    unseeded = any(p.temperature and p.seed is None for p in SCENARIOS[name])
    assert unseeded or same(chained, unchained), name
    assert all(len(row) == TOKENS for row in chained)
    if name == "top_logprobs":  # the likeliest first, and greedy picks it
        assert all(len(top) == 3 and top[0][0] == i for i, _, top in chained[0])


def test_penalties_and_a_bias_read_the_history_mlx_lm_passes_its_processors(tiny, shard):
    """Greedy rows with penalties and a bias, chained in one group, give what mlx-lm's own loop
    gives each alone with the same processors over the same history."""
    params = [
        P(temperature=0.0, repetition_penalty=1.5, logit_bias={7: 1.5}),
        P(temperature=0.0, presence_penalty=0.8, frequency_penalty=0.6),
    ]
    got, share = decode(shard, params)
    assert share >= 0.95
    model = load_model(tiny)[0]
    for p, prompt, row in zip(params, PROMPTS, got):
        processors = make_logits_processors(
            p.logit_bias,
            p.repetition_penalty,
            CONTEXT,
            p.presence_penalty,
            CONTEXT,
            p.frequency_penalty,
            CONTEXT,
        )
        steps = generate_step(
            mx.array(prompt),
            model,
            max_tokens=TOKENS,
            sampler=lambda lp: mx.argmax(lp, axis=-1),
            logits_processors=processors,
        )
        assert [i for i, _, _ in row] == [int(t) for t, _ in steps], p


def test_grammar_rows_chain_with_their_masks_computed_while_the_next_step_runs(
    default_model, tmp_path
):
    from mlx_ring.serving.grammar import Grammars
    from mlx_ring.serving.grammar_text import json_grammar

    tokenizer = load_tokenizer(default_model)
    vocab = json.loads((default_model / "config.json").read_text())["vocab_size"]
    model = make_tiny_model(tmp_path / "m", "llama", vocab_size=vocab)
    shard = load_shard(model, uniform_plan(7, 1), 0)
    grammars = Grammars(tokenizer, vocab)
    grammar = json_grammar({"type": "array", "items": {"type": "integer"}, "minItems": 40})
    params = [
        P(temperature=0.0, grammar=grammar),
        P(temperature=0.0),
        P(temperature=0.7, seed=3, grammar=grammar),
    ]
    end = tokenizer.eos_token_ids
    chained, share = decode(shard, params, constrain=grammars.processor, end=end)
    unchained, _ = decode(shard, params, chain=False, constrain=grammars.processor, end=end)
    assert share >= 0.95 and same(chained, unchained)
    for row in (chained[0], chained[2]):
        text = tokenizer.decode([i for i, _, _ in row])
        assert text.startswith("[") and all(c in "[]-, 0123456789" for c in text), text


@pytest.mark.parametrize("prefix", [False, True])
def test_rows_joining_and_leaving_ride_ahead_of_the_chained_step(tiny, shard, prefix):
    """Sequences that arrive and leave all the while, with seeds, penalties and alternatives, and
    (with the prompt cache) blocks saved and loaded: the calls, filters and joins go just before
    the group's next step, which still goes out chained, with the tokens of unchained steps;
    greedy rows decode what mlx-lm decodes for each alone."""
    from ringutil import reference_logits

    from mlx_ring.cache.blocks import BlockIndex

    rng = random.Random(0)
    kinds = [P(temperature=0.0), P(temperature=0.8, seed=9), P(temperature=0.0, top_logprobs=2)]
    shared = [rng.randrange(1, 300) for _ in range(8)]  # a start some prompts share
    spec = [
        (
            shared[: rng.randint(0, 8)]
            + [rng.randrange(1, 300) for _ in range(rng.randint(2, 12))],
            rng.randint(5, 30),
            3 * i,
            kinds[i % 3],
        )
        for i in range(14)
    ]

    def run(chain):
        pipe = Pipeline(shard, Ring(mx.distributed.init()))
        index = BlockIndex(1 << 16, block=4) if prefix else None
        sched = Scheduler(pipe, shard, groups=1, chunk=8, prefix=index)
        if not chain:
            sched._may_chain = lambda g, rows: False
        decodes, submit = [], pipe.submit
        pipe.submit = lambda h, p, tag=None, chained=False: (
            h.kind == Kind.DECODE and decodes.append(chained),
            submit(h, p, tag, chained),
        )
        seqs = [Sequence(i, p, params) for i, (p, _, _, params) in enumerate(spec)]
        got, step = {s.id: [] for s in seqs}, 0
        while step <= spec[-1][2] or not sched.idle():
            for s, (_, _, at, _) in zip(seqs, spec):
                if at == step:
                    sched.add(s)
            for s, t in sched.step():
                got[s.id].append((t.id, t.logprob, t.top))
                if len(got[s.id]) == spec[s.id][1]:
                    sched.remove(s)
            step += 1
        assert shard.status_row().open_sequences == 0 and sched.idle()
        return [got[i] for i in range(len(spec))], sum(decodes) / len(decodes)

    chained, share = run(True)
    unchained, none = run(False)
    assert share >= 0.95 and none == 0, share
    assert same(chained, unchained)
    for (prompt, n, _, params), row in zip(spec, chained):
        if params.temperature == 0:
            assert [i for i, _, _ in row] == reference_logits(tiny, prompt, n)[1]


@pytest.mark.parametrize("wait", range(1, 5))
def test_a_step_whose_rows_all_left_chains_on_for_the_rows_that_joined(shard, wait):
    """Every row of the step coming home left (a client gone, a stop string found on the HTTP
    side) as another joined the group: the chained step goes on with the joined row alone."""
    pipe = Pipeline(shard, Ring(mx.distributed.init()))
    sched = Scheduler(pipe, shard, groups=1, chunk=8)
    first, second = Sequence(0, PROMPTS[0], P(temperature=0.0)), Sequence(1, PROMPTS[1], P())
    got = {0: 0, 1: 0}
    sched.add(first)
    while got[0] < 3:
        got[0] += len(sched.step())
    sched.add(second)
    steps = 0
    while not sched.idle():
        assert steps < 10 * TOKENS, "the joined row never finished"
        for s, t in sched.step():
            assert not isinstance(t, Exception), t
            got[s.id] += 1
            if s is second and got[1] == TOKENS:
                sched.remove(second)
        steps += 1
        if steps == wait and not first.removed:
            sched.remove(first)
    assert got[1] == TOKENS and shard.status_row().open_sequences == 0
