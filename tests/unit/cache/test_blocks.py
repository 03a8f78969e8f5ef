"""Rank 0's block index (pure bookkeeping): chain keys, the longest cached start to the token,
tails, a budget kept by evicting least recently used leaves, and rank 0's disk behind the RAM."""

from mlx_ring.cache.blocks import BlockIndex, chain_keys, common_prefix, key_ints, key_of


def test_common_prefix():
    assert common_prefix((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix((1, 2, 3), (1, 9, 3)) == 1
    assert common_prefix((), (1,)) == 0
    assert common_prefix(tuple(range(1000)), tuple(range(777)) + (0,)) == 777


def test_a_key_names_its_block_and_everything_before_it():
    a = chain_keys(list(range(12)), b"s", 4)
    assert len(a) == 3 and len(set(a)) == 3
    assert chain_keys(list(range(8)) + [0, 0, 0, 0], b"s", 4)[:2] == a[:2]
    assert chain_keys([9] + list(range(1, 12)), b"s", 4)[1] != a[1]  # the parent differs
    assert chain_keys(list(range(12)), b"t", 4) != a  # another model or format
    assert len(chain_keys(list(range(10)), b"s", 4, tail=True)) == 3
    assert key_of(key_ints(a[0])) == a[0]


def test_a_prompt_reuses_to_the_token_and_keeps_its_last_token_to_prefill():
    idx = BlockIndex(100, block=4)
    saved = idx.add(list(range(10)))  # two full blocks and a tail of 2
    assert [(s, ram) for s, _, ram in saved.keep] == [(0, True), (4, True), (8, True)]
    assert idx.held == 10
    assert idx.lookup(list(range(10)) + [50, 51]).tokens == 10
    assert idx.lookup(list(range(6)) + [99, 98]).tokens == 6  # the second block, in part
    assert idx.lookup(list(range(10))).tokens == 9  # the whole prompt cached: its last token runs
    assert idx.lookup([7, 1, 2]).tokens == 0
    hit = idx.lookup(list(range(12)) + [1])
    assert hit.tokens == 10 and len(hit.blocks) == 3


def test_a_longer_turn_replaces_the_tail_it_starts_with_and_a_covered_one_adds_nothing():
    idx = BlockIndex(100, block=4)
    idx.add(list(range(6)))
    saved = idx.add(list(range(11)))
    assert len(saved.drop) == 1 and idx.held == 11  # the tail [4, 5] went
    assert idx.add(list(range(9))).keep == []  # held already: a block starts with its tail


def test_least_recently_used_leaves_go_first_and_never_the_chain_being_saved():
    idx = BlockIndex(12, block=4)
    idx.add([1] * 8)
    idx.add([2] * 4)
    idx.lookup([1] * 9)
    idx.use(idx.lookup([1] * 9), 8)  # the ones are used last
    saved = idx.add([3] * 4)
    assert len(saved.drop) == 1 and idx.lookup([2] * 5).tokens == 0
    assert idx.lookup([1] * 9).tokens == 8
    # longer than the budget: what fits stays in RAM, the rest goes to the disks only
    saved = idx.add([5] * 20)
    assert [ram for *_, ram in saved.keep] == [True, True, True, False, False]
    assert idx.held <= 12


def test_a_block_is_evicted_after_its_suffixes():
    idx = BlockIndex(12, block=4)
    idx.add([1] * 12)
    idx.use(idx.lookup([1] * 4 + [0]), 4)  # the first block is the newest
    saved = idx.add([2] * 4)
    assert saved.drop == [chain_keys([1] * 12, b"", 4)[2]]  # its suffix went, not it


def test_full_blocks_on_rank_0s_disk_follow_the_ram_ones():
    on_disk = set(chain_keys(list(range(16)), b"", 4))
    idx = BlockIndex(100, block=4, on_disk=on_disk.__contains__)
    hit = idx.lookup(list(range(16)) + [3])
    assert (hit.tokens, hit.on_disk) == (0, 4)
    idx.add(list(range(6)))
    hit = idx.lookup(list(range(16)) + [3])
    assert (hit.tokens, len(hit.blocks), hit.on_disk) == (4, 1, 3)
    idx.use(hit, 16, from_disk=3)
    assert (idx.hit_tokens, idx.disk_tokens) == (16, 12)


def test_a_whole_block_index_keeps_and_gives_whole_blocks_only():
    idx = BlockIndex(100, block=4, whole=True)
    saved = idx.add(list(range(10)))  # two full blocks; the tail of 2 is not kept
    assert [(s, ram) for s, _, ram in saved.keep] == [(0, True), (4, True)]
    assert idx.held == 8
    assert idx.lookup(list(range(10)) + [50, 51]).tokens == 8
    hit = idx.lookup(list(range(6)) + [99, 98])  # the second block in part: not reused
    assert (hit.tokens, len(hit.blocks)) == (4, 1)
    assert idx.lookup(list(range(8))).tokens == 4  # the last token runs: the block it ends goes
    assert idx.lookup(list(range(9))).tokens == 8
    assert idx.lookup(list(range(3)) + [7]).tokens == 0
    assert idx.add(list(range(11))).keep == []  # its full blocks are held; its tail never is
    assert idx.add(list(range(12))).keep == [(8, chain_keys(list(range(12)), b"", 4)[2], True)]


def test_blocks_an_earlier_call_kept_get_no_line_again():
    idx = BlockIndex(100, block=4, whole=True)
    keys = chain_keys(list(range(12)), b"", 4)
    assert [k for _, k, _ in idx.add(list(range(8))).keep] == keys[:2]
    assert idx.add(list(range(12)), since=8).keep == [(8, keys[2], True)]
    # a kept block that left RAM since: it is on the disks, and so are the blocks after it
    idx = BlockIndex(4, block=4, whole=True, on_disk=lambda key: False)
    idx.add(list(range(4)))
    idx.add([9] * 4)  # evicts the first
    assert idx.add(list(range(12)), since=4).keep == [(4, keys[1], False), (8, keys[2], False)]
