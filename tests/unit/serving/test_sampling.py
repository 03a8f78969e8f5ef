"""Sampling's randomness, row by row: a seeded row's draws depend on its own seed alone, and an
unseeded row's on fresh entropy, never on a seeded neighbour's seed."""

import mlx.core as mx

from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.sampling import SequenceSampler, sample_rows

VOCAB = 4096


def draws(rows: list[SamplingParams], steps: int = 24) -> list[list[int]]:
    """Each row's tokens over `steps` steps of flat logits (every token equally likely)."""
    samplers = [SequenceSampler(p, [1, 2, 3]) for p in rows]
    out = [[] for _ in rows]
    for _ in range(steps):
        for i, t in enumerate(sample_rows(samplers, mx.zeros((len(rows), VOCAB)))):
            out[i].append(t.id)
    return out


def test_an_unseeded_row_is_not_fixed_by_a_seeded_neighbour():
    seeded, free = SamplingParams(seed=7), SamplingParams(top_p=0.99)
    mx.random.seed(1)
    first = draws([seeded, free])
    mx.random.seed(2)  # another moment's entropy
    second = draws([seeded, free])
    assert first[0] == second[0], "a seeded row draws the same whatever the moment"
    assert first[1] != second[1], "the unseeded row's draws were fixed by its neighbour's seed"


def test_a_seeded_row_draws_the_same_alone_or_in_company():
    seeded = SamplingParams(seed=1234, top_k=50)
    alone = draws([seeded])[0]
    beside = draws([SamplingParams(), seeded, SamplingParams(seed=99), SamplingParams(min_p=0.01)])[
        1
    ]
    assert alone == beside and len(set(alone)) > 1
    assert draws([SamplingParams(seed=1235, top_k=50)])[0] != alone
    assert (
        draws([SamplingParams(seed=(1 << 63) - 1)])[0]
        == draws([SamplingParams(seed=(1 << 63) - 1)])[0]
    )
    assert (
        draws([SamplingParams(seed=-(1 << 63))])[0]
        != draws([SamplingParams(seed=(1 << 63) - 1)])[0]
    )


def test_rows_that_report_no_logprobs_draw_the_same_tokens_unnormalised():
    logits = mx.random.normal((4, VOCAB), key=mx.random.key(3)) * 4 + 10  # far from normalised
    for params in (
        dict(temperature=0.0),
        dict(temperature=0.8),
        dict(temperature=0.8, top_k=20, min_p=0.05),
    ):
        got = []
        for report in (True, False):
            mx.random.seed(5)
            rows = [
                SequenceSampler(SamplingParams(**params, logprobs=report), [1]) for _ in range(4)
            ]
            got.append(sample_rows(rows, logits))
        assert [t.id for t in got[0]] == [t.id for t in got[1]], params
        # NaN: not computed
        assert all(t.logprob < 0 for t in got[0]) and all(t.logprob != t.logprob for t in got[1])
