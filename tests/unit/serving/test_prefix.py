"""The prompt-cache index on rank 0 (pure bookkeeping): longest prefix,
dominated entries, LRU budget."""

import random

from mlx_ring.serving.prefix import PrefixIndex, common_prefix


def test_common_prefix():
    assert common_prefix((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix((1, 2, 3), (1, 9, 3)) == 1
    assert common_prefix((), (1,)) == 0
    assert common_prefix(tuple(range(1000)), tuple(range(777)) + (0,)) == 777


def test_lookup_finds_the_longest_prefix_and_keeps_the_last_token_to_prefill():
    idx = PrefixIndex(100)
    a, _ = idx.add([1, 2, 3, 4])
    b, _ = idx.add([1, 2, 9])
    assert idx.lookup([1, 2, 3, 4, 5, 6]) == (a, 4)
    assert idx.lookup([1, 2, 9, 9]) == (b, 3)
    assert idx.lookup([1, 2, 3, 4]) == (a, 3)  # the whole prompt cached: its last token still runs
    assert idx.lookup([7, 1, 2]) == (0, 0)
    assert idx.lookup([1]) == (0, 0)


def test_an_entry_the_new_one_extends_goes_and_a_covered_prompt_adds_nothing():
    idx = PrefixIndex(100)
    a, _ = idx.add([1, 2, 3])
    b, drop = idx.add([1, 2, 3, 4, 5])
    assert drop == [a] and list(idx.entries) == [b] and idx.held == 5
    assert idx.add([1, 2, 3]) == (0, [])  # held already, as the start of b
    assert idx.add(list(range(101))) == (0, [])  # over the whole budget: not cached


def test_least_recently_used_goes_first_within_the_budget():
    idx = PrefixIndex(10)
    a, _ = idx.add([1, 2, 3, 4])
    b, _ = idx.add([5, 6, 7, 8])
    idx.use(*idx.lookup([1, 2, 3, 4, 0]))  # a is used: b is now the oldest
    c, drop = idx.add([9, 9, 9])
    assert drop == [b] and set(idx.entries) == {a, c} and idx.held == 7
    assert (idx.hits, idx.hit_tokens) == (1, 4)


def test_lookup_equals_a_scan_of_every_entry_and_no_entry_starts_another():
    """The trie's answer is the scan's (the longest start shared with any entry), through adds that
    drop dominated entries and evict old ones; prompts share starts as chats and templates do."""
    rng = random.Random(0)
    idx = PrefixIndex(400)
    starts = [[rng.randrange(5) for _ in range(rng.randrange(2, 30))] for _ in range(4)]
    for _ in range(300):
        prompt = rng.choice(starts) + [rng.randrange(5) for _ in range(rng.randrange(0, 40))]
        best = max(
            (common_prefix(e.tokens, tuple(prompt)) for e in idx.entries.values()), default=0
        )
        entry, n = idx.lookup(prompt)
        assert n == min(best, len(prompt) - 1)
        assert n == 0 or common_prefix(idx.entries[entry].tokens, tuple(prompt)) >= n
        idx.add(prompt)
        tokens = [e.tokens for e in idx.entries.values()]
        assert not any(a != b and b[: len(a)] == a for a in tokens for b in tokens)
        assert idx.held == sum(map(len, tokens)) <= 400
