"""Speculative decoding's parts without a ring: prompt lookup, the adaptive draft length, the cache
trim every rank applies, and the acceptance rule's distribution."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import BatchKVCache

from mlx_ring.models.compat import trim_rows
from mlx_ring.serving.params import SamplingParams
from mlx_ring.serving.sampling import SequenceSampler
from mlx_ring.serving.speculative import NGRAMS, Drafter, ModelDrafter, Streak, verify


def lookup(history: list[int], k: int) -> list[int]:
    """Prompt lookup by scanning the whole history (the drafter's index must find the same), checked
    here first, then through a fresh drafter."""
    for n in NGRAMS:
        if len(history) <= n:
            continue
        tail = history[-n:]
        for i in range(len(history) - n - 1, -1, -1):
            if history[i : i + n] == tail:
                return history[i + n : i + n + k]
    return []


def drafted(history: list[int], k: int) -> list[int]:
    return Drafter(most=k).propose(history)


@pytest.mark.parametrize("lookup", [lookup, drafted])
def test_lookup_takes_what_followed_the_latest_longest_match(lookup):
    h = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    assert lookup(h, 2) == [4, 5]  # "1 2 3" at 0 wins over the later "2 3" at 6 (longest first)
    assert lookup(h[:-1] + [0, 2, 3], 2) == [7, 8]  # no 3-gram: the latest "2 3"
    assert lookup([5, 6, 7, 1, 6, 7], 3) == [1, 6, 7]  # no 3-gram: the 2-gram "6 7"
    assert lookup([1, 2, 3, 4], 3) == []  # nothing repeats
    # the latest earlier occurrence: one token precedes the tail
    assert lookup([4, 4, 4, 4], 5) == [4]


def test_the_drafters_index_finds_what_lookup_finds_as_the_history_grows():
    rng = np.random.default_rng(0)
    history, d = [], Drafter(most=5)
    for _ in range(400):
        # a small alphabet: many repeats
        history += rng.integers(0, 6, size=int(rng.integers(1, 4))).tolist()
        assert d.propose(history) == lookup(history, 5), history


def test_drafter_grows_on_full_accepts_and_pauses_longer_after_each_miss():
    d = Drafter(most=6)
    d.k = 2
    d.update(2, 2)
    assert d.k == 4
    d.update(4, 1)
    assert d.k == 2 and d.pause == 0
    drafting = 0
    for _ in range(400):  # drafts that are always rejected: drafting backs off to one step in 64
        if d.draft([1, 2, 3, 1, 2, 3]):
            drafting += 1
            d.update(d.k, 0)
    assert drafting <= 12, drafting  # 3% of steps, falling to 1 in 64
    assert d.draft([1, 2, 3, 4]) == [] or d.pause  # no match: no drafts


def test_lookup_says_before_a_token_is_read_whether_it_could_draft_after_it():
    rng = np.random.default_rng(1)
    history, d = [], Drafter(most=4)
    for _ in range(300):
        history += rng.integers(0, 40, size=int(rng.integers(1, 3))).tolist()
        if not d.may_propose_next(history):  # then no next token gives a lookup anything
            assert all(lookup(history + [x], 4) == [] for x in range(40)), history
    assert not Drafter(most=4).may_propose_next([1, 2, 3]) and Drafter(most=4).may_propose_next(
        [1, 2, 1]
    )


def test_a_draft_model_starts_short_and_backs_off_four_times_faster():
    d = ModelDrafter(most=6)  # no model needed: its guesses are replaced by ones always rejected
    assert d.k == 2
    d.propose = lambda history: [0] * d.k
    drafted_at = []
    for step in range(400):
        if d.draft([1, 2, 3]):
            drafted_at.append(step)
            d.update(d.k, 0)
    assert drafted_at == [0, 4, 20, 84, 340]  # pauses of 3, 15, 63, then 255 steps


def test_a_new_stream_starts_from_the_draft_models_misses_in_a_row():
    streak = Streak()

    # a stream whose drafts are all kept from step kept_from on
    def stream(kept_from=10**9, steps=300):
        d, drafted_at = ModelDrafter(most=6, streak=streak), []
        d.propose = lambda history: [0] * d.k
        for step in range(steps):
            if d.draft([1, 2, 3]):
                drafted_at.append(step)
                d.update(d.k, d.k if step >= kept_from else 0)
        return drafted_at

    assert stream() == [0, 4, 20, 84]
    assert streak.misses == 4
    # after a draft model never right, a new stream tries once in its first 256 steps
    assert stream() == [255]
    assert stream(kept_from=255) == list(range(255, 300))  # kept: it drafts every step
    assert streak.misses == 0
    assert stream(steps=30) == [0, 4, 20]  # so the next stream starts drafting at once


@pytest.mark.parametrize("drops", [[1, 3, 2], [2, 2, 2], [0, 4, 1]])
def test_trim_rows_keeps_each_rows_tokens_at_their_positions(drops):
    mx.random.seed(1)
    padding = [2, 0, 1]
    x = mx.random.normal((3, 2, 6, 4))  # (B, kv heads, positions, head dim)
    c = BatchKVCache(padding)
    c.update_and_fetch(x, -x)
    trim_rows(c, drops)
    for b, (pad, drop) in enumerate(zip(padding, drops)):
        kept = x[b, :, pad : 6 - drop]
        start = c.left_padding[b].item()
        assert c.offset[b].item() == 6 - pad - drop  # RoPE position of the row's next token
        np.testing.assert_array_equal(c.keys[b, :, start : c._idx], kept)
        np.testing.assert_array_equal(c.values[b, :, start : c._idx], -kept)
    assert c._idx == 6 - min(drops)


def test_greedy_verify_keeps_drafts_while_they_are_the_argmax():
    logits = mx.log(mx.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.4, 0.1]]))
    s = SequenceSampler(SamplingParams(temperature=0.0), [0])
    # all kept, then the bonus token
    assert [t.id for t in verify(s, logits, [1, 0, 2])] == [1, 0, 2, 0]
    s = SequenceSampler(SamplingParams(temperature=0.0), [0])
    # the second draft is not the argmax
    assert [t.id for t in verify(s, logits, [1, 2, 2])] == [1, 0]
    assert s.history == [0, 1, 0]


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3)]
)
def test_sampled_verify_follows_the_target_distribution(params):
    # Drafts 2 then 1: the first token must follow p0 and, after the draft is kept, the second must
    # follow p1, whatever the drafts are (the rejection rule).
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(3, 5)).astype(np.float32) * 1.5
    logits = mx.array(raw)

    def target(row):
        z = raw[row] - raw[row].max()
        if params.top_k:
            z = np.where(z >= np.sort(z)[-params.top_k], z, -np.inf)
        p = np.exp(z / params.temperature)
        return p / p.sum()

    mx.random.seed(3)
    first, second = np.zeros(5), np.zeros(5)
    for _ in range(6000):
        kept = verify(SequenceSampler(params, [0]), logits, [2, 1])
        first[kept[0].id] += 1
        if kept[0].id == 2:
            second[kept[1].id] += 1
    # Pearson's chi-square against the target: below 18.5, the 0.1% point for 4 degrees of freedom
    # (always keeping the draft, or sampling the draft's residual always, scores in the thousands).
    for counts, p in ((first, target(0)), (second, target(1))):
        seen = p > 0
        assert counts[~seen].sum() == 0  # top-k: nothing outside the target's support
        chi2 = ((counts[seen] - counts.sum() * p[seen]) ** 2 / (counts.sum() * p[seen])).sum()
        assert chi2 < 18.5, (counts, p)


def test_unfused_attention_matches_the_fused_kernel_on_a_padded_batch():
    # What verify passes run on CUDA: the model's own layers, attention swapped for plain matmuls.
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.llama import Model, ModelArgs

    from mlx_ring.models.compat import unfused_attention

    mx.random.seed(2)
    model = Model(
        ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=100,
        )
    )
    caches = [BatchKVCache([3, 0]) for _ in model.layers]
    model(mx.array([[0, 0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7]]), cache=caches)
    h = model.model.embed_tokens(mx.array([[9, 10, 11], [12, 13, 14]]))
    mask = create_attention_mask(h, caches[0])
    outs = []
    for enabled in (False, True):
        x = h
        for layer, c in zip(model.model.layers, caches):
            with unfused_attention(enabled):
                x = layer(x, mask, c)
            c.trim(3)
        outs.append(x)
    np.testing.assert_allclose(np.array(outs[1]), np.array(outs[0]), atol=1e-5)
    with unfused_attention(True):
        # the string mask, no cache before
        causal = model.model.layers[0](h[1:], "causal", BatchKVCache([0]))
    np.testing.assert_allclose(
        np.array(causal),
        np.array(model.model.layers[0](h[1:], "causal", BatchKVCache([0]))),
        atol=1e-5,
    )


def test_draft_settings_are_checked_at_the_edge():
    from mlx_ring.config import parse_config

    with pytest.raises(ValueError, match="DRAFT_MODEL=m needs DRAFT_TOKENS"):
        parse_config(["--draft-model", "m"])
    with pytest.raises(ValueError, match="DRAFT_TOKENS=17 must be 0"):
        parse_config(["--draft-tokens", "17"])
    cfg, _ = parse_config(["--draft-tokens", "4", "--draft-model", "m"])
    assert (cfg.draft_tokens, cfg.draft_model) == (4, "m")


def test_unfused_attention_leaves_attention_sinks_to_the_fused_kernel():
    # GPT-OSS passes sinks; prefill chunks on CUDA attend unfused, so such a call
    # must still be exact.
    from mlx_ring.models.compat import unfused_attention

    q, k, v = (mx.random.normal(s) for s in ((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)))
    sinks = mx.random.normal((4,))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal", sinks=sinks)
    with unfused_attention(True):
        got = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask="causal", sinks=sinks)
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-6)
