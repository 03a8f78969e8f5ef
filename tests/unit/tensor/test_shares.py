"""tensor_shares: whether a config splits N ways for tensor mode, and each rank's share (pure); and
split_model on one rank. The multi-rank check that split_model cuts as tensor_shares says is
tests/ring/test_tensor_matrix.py."""

import json
from itertools import combinations

import pytest

from mlx_ring.models import support
from mlx_ring.tensor.shares import _reading, even, head_split, record, spans, tensor_shares


@pytest.fixture
def smollm2(default_model) -> dict:
    return json.loads((default_model / "config.json").read_text())


def test_the_default_model_splits_its_3_kv_heads_2_and_1_on_2_ranks(smollm2):
    a, b = tensor_shares(smollm2, 2)
    assert (a.heads, a.kv_heads, b.heads, b.kv_heads) == (6, 2, 3, 1)
    assert a.columns == b.columns == 768  # 1536 MLP columns halve
    assert a.fraction > b.fraction > 0.5 - 1e-9  # the embedding (tied to the head) is on both


def test_the_default_model_splits_evenly_3_ways(smollm2):
    shares = tensor_shares(smollm2, 3)
    assert [(s.heads, s.kv_heads, s.columns) for s in shares] == [(3, 1, 512)] * 3
    assert len({s.fraction for s in shares}) == 1


def test_the_default_model_shares_a_kv_head_on_4_ranks_and_cannot_go_10_ways(smollm2):
    # 3 + 2 + 2 + 2 query heads; ranks 1 and 2 both read KV head 1, 2 and 3 KV head 2
    shares = tensor_shares(smollm2, 4)
    assert [(s.heads, s.kv_heads) for s in shares] == [(3, 1), (2, 1), (2, 2), (2, 1)]
    assert shares[2].fraction > shares[1].fraction  # the KV head kept twice is in its share
    with pytest.raises(
        ValueError,
        match=r"^llama can't be split for tensor mode: 9 query heads cannot be shared by 10 "
        r"ranks; use PARALLEL=pipeline$",
    ):
        tensor_shares(smollm2, 10)


@pytest.mark.parametrize(
    "heads,kv", [(9, 3), (6, 3), (16, 2), (10, 2), (12, 4), (8, 1), (32, 8), (40, 8), (28, 4)]
)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_every_query_head_reads_its_own_kv_head_on_the_rank_that_holds_it(heads, kv, n):
    if heads < n:
        return
    split = head_split(heads, kv, n)
    # every query head once, in order
    assert [(h.start, h.end) for h in split] == spans([h.end - h.start for h in split])
    assert split[-1].end == heads and all(h.end > h.start for h in split)
    for h in split:
        # equal groups, as attention's grouped queries need
        assert (h.end - h.start) % len(h.kv) == 0
        # Local query head i reads the rank's KV head i // group: the model's KV head of query head
        # start + i.
        assert [h.kv[i // h.group] for i in range(h.end - h.start)] == [
            q // (heads // kv) for q in range(h.start, h.end)
        ]
    if kv >= n:  # whole groups: no KV head kept twice
        assert sorted(j for h in split for j in h.kv) == list(range(kv))
    else:  # the query heads as even as they go
        assert max(h.end - h.start for h in split) - min(h.end - h.start for h in split) <= 1


def test_the_split_keeps_the_fewest_kv_heads_of_every_even_split_and_is_quick_for_many_ranks():
    def kept(split):
        return max(len(h.kv) for h in split), sum(len(h.kv) for h in split)

    for kv, g, n in [
        (k, g, n) for k in range(1, 5) for g in range(1, 7) for n in range(k + 1, min(k * g, 9) + 1)
    ]:
        size, extra = divmod(kv * g, n)
        every = [[size + (r in big) for r in range(n)] for big in combinations(range(n), extra)]
        best = min(kept([_reading(a, b, g) for a, b in spans(sizes)]) for sizes in every)
        assert kept(head_split(kv * g, kv, n)) == best, (kv * g, kv, n)
    # 100 ranks: C(100, 28) even splits, not tried one by one
    assert len(head_split(128, 8, 100)) == 100


def test_a_kv_head_read_by_unequal_runs_of_queries_is_kept_once_per_run_unit():
    # 10 query heads over 2 KV heads on 3 ranks: 3 + 4 + 3 puts 2 + 2 queries of each KV head
    # on rank 1 (one copy each), where 4 + 3 + 3 would need KV head 1 twice on rank 1 (runs
    # of 1 and 2).
    assert [(h.start, h.end, h.kv) for h in head_split(10, 2, 3)] == [
        (0, 3, (0,)),
        (3, 7, (0, 1)),
        (7, 10, (1,)),
    ]
    # 5 + 6 + 5: 3 + 3 on rank 1
    assert [h.kv for h in head_split(16, 2, 3)] == [(0,), (0, 1), (1,)]
    assert [h.kv for h in head_split(5, 1, 2)] == [(0,), (0,)]
    with pytest.raises(ValueError, match="^6 query heads are not whole groups of 4 KV heads$"):
        head_split(6, 4, 2)


def test_one_rank_holds_everything(smollm2):
    (s,) = tensor_shares(smollm2, 1)
    assert (s.heads, s.kv_heads, s.columns) == (9, 3, 1536) and s.fraction == pytest.approx(1.0)


@pytest.mark.parametrize("n", [2, 3])
def test_shares_add_up_to_the_model_with_the_replicated_part_on_every_rank(smollm2, n):
    shares = tensor_shares(smollm2, n)
    assert sum(s.heads for s in shares) == 9 and sum(s.kv_heads for s in shares) == 3
    assert sum(s.columns for s in shares) == 1536
    replicated = (
        49152 * 576 / (49152 * 576 + 30 * (9 * 2 * 576 * 64 + 3 * 2 * 576 * 64 + 1536 * 3 * 576))
    )
    assert sum(s.fraction for s in shares) == pytest.approx(1 + (n - 1) * replicated)


def test_quantized_columns_split_in_whole_groups(smollm2):
    config = dict(smollm2, quantization={"group_size": 64, "bits": 4})
    shares = tensor_shares(config, 3)  # 1536 columns are 24 groups of 64: 8 each
    assert [s.columns for s in shares] == [512] * 3
    # 25 groups of 64
    config = dict(smollm2, intermediate_size=1600, quantization={"group_size": 64, "bits": 4})
    if record()["admitted"]["llama"]["uneven"]:
        assert [s.columns for s in tensor_shares(config, 3)] == [576, 512, 512]


def test_heads_that_do_not_fill_whole_quantization_groups_are_refused(smollm2):
    # rank 1 starts at head 6: 96 columns
    config = dict(smollm2, head_dim=16, quantization={"group_size": 64, "bits": 4})
    with pytest.raises(
        ValueError,
        match=(
            "heads of 16 columns do not fill whole quantization groups of 64; use PARALLEL=pipeline"
        ),
    ):
        tensor_shares(config, 2)


def test_a_type_the_matrix_refused_or_never_ran_is_refused_with_its_reason(smollm2):
    refused = record()["refused"]
    kind = sorted(refused)[0]
    with pytest.raises(
        ValueError,
        match=f"^{kind} can't be split for tensor mode: its test split 2 and 3 ways fails: ",
    ):
        tensor_shares(dict(smollm2, model_type=kind), 2)
    with pytest.raises(ValueError, match="no test has split it across ranks"):
        tensor_shares(dict(smollm2, model_type="no_such_type"), 2)


def test_a_wrapped_text_config_is_read(smollm2):
    kind = next(
        k
        for k in sorted(record()["admitted"])
        if k in support.SUPPORTED and k.startswith("qwen3_vl")
    )
    text = {
        k: smollm2[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "num_hidden_layers",
        )
    }
    shares = tensor_shares({"model_type": kind, "vocab_size": 100, "text_config": text}, 3)
    assert [(s.heads, s.kv_heads) for s in shares] == [(3, 1)] * 3


def test_even_and_spans():
    assert even(3, 2) == [2, 1] and spans([2, 1]) == [(0, 2), (2, 3)]
    assert even(1536, 5, 64) == [320, 320, 320, 320, 256]
    assert even(100, 3, 32) == [32, 32, 36]  # a remainder under a group stays with the last rank


def test_a_type_tested_only_with_mlx_lms_even_split_is_refused_where_it_would_split_unevenly(
    smollm2,
):
    even_only = sorted(k for k, v in record()["admitted"].items() if not v["uneven"])
    assert even_only, (
        "the matrix found every admitted type splitting unevenly; this test needs another case"
    )
    config = dict(smollm2, model_type=even_only[0], num_attention_heads=6, num_key_value_heads=6)
    assert [s.heads for s in tensor_shares(config, 3)] == [2, 2, 2]
    with pytest.raises(
        ValueError,
        match=f"^{even_only[0]} can't be split for tensor mode: .* do not split evenly 4 ways, "
        "and only mlx-lm's shard\\(\\), which splits evenly, is tested for it",
    ):
        tensor_shares(config, 4)


def test_split_model_on_one_rank_leaves_the_model_whole(default_model):
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from mlx_ring.tensor.cut import split_model

    model = load_model(default_model, lazy=True)[0]
    before = {k: v.shape for k, v in tree_flatten(model.parameters())}
    split_model(model, mx.distributed.init())  # a world of one
    assert {k: v.shape for k, v in tree_flatten(model.parameters())} == before
