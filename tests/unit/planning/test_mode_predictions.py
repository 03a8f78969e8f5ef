"""What each mode's prediction is made of and where it is shown: an all_sum's cost and the probe's
fit of it, tensor mode's memory and each rank's share of a layer, tokens/s and the first token per
mode, the table of modes and the status line: pure, no MLX."""

import json

import pytest
from modeshapes import H100, HALVES, LLAMA_8B, LLAMA_70B_CUT, LLAMA_CONFIG, TCP_1MS, choose

from mlx_ring.planning.allsum import (
    PROBE,
    backend_of,
    cached,
    fit,
    parse,
    remember,
    ring_allsum,
    ring_key,
)
from mlx_ring.planning.auto import format_modes, predict
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import DEFAULT_ALLSUM, AllSum, embed_bytes, tensor_kv_room, tensor_need
from mlx_ring.planning.plan import ModelSpec, plan_from_sizes
from mlx_ring.planning.split import ShareSize, even_sizes, tensor_shares


def test_all_sum_cost_scales_with_the_ring():
    a = AllSum(0.5, 2.0, 2)
    assert a.seconds(2e6, 2) == pytest.approx(0.5e-3 + 1e-3)
    # 3 steps a way, 2(n-1)/n of the bytes
    assert a.seconds(2e6, 4) == pytest.approx(3 * 0.5e-3 + 1.5 * 1e-3)
    # measured on that ring
    assert AllSum(0.5, 2.0, 4).seconds(2e6, 4) == pytest.approx(0.5e-3 + 1e-3)
    assert a.seconds(2e6, 1) == 0.0


def test_tensor_memory_is_a_share_of_every_layer_and_every_rank_the_embedding():
    cap = H100[0]
    rank0, rank1 = (tensor_need(LLAMA_8B, cap, r, HALVES[r], 8192) for r in (0, 1))
    assert rank0 - rank1 == pytest.approx(LLAMA_8B.ends_bytes - embed_bytes(LLAMA_8B))
    assert embed_bytes(LLAMA_8B) == pytest.approx(1.05e9)  # untied: the head stays on rank 0
    tied = ModelSpec(30, 1e7, 0.6e8, 0.57e8, 1152, 1e7, 2e7, 1e8)
    assert embed_bytes(tied) == tied.ends_bytes  # tied: the embedding is the head
    whole = tensor_need(LLAMA_8B, cap, 0, ShareSize(1.0, 1.0), 8192)
    # half the layers and half their cache
    assert whole - rank0 == pytest.approx(16 * (436e6 + 8192 * 4096))
    # a rank keeping every KV head
    kept_twice = tensor_need(LLAMA_8B, cap, 0, ShareSize(0.5, 1.0), 8192)
    assert kept_twice - rank0 == pytest.approx(16 * 8192 * 4096)
    small = [Capabilities("a", 16, 10, 4, 120), Capabilities("b", 64, 48, 30, 546)]
    assert tensor_kv_room(LLAMA_8B, small, HALVES, 8192) < tensor_kv_room(
        LLAMA_8B, small[1:] * 2, HALVES, 8192
    )


def test_predictions_per_stream_and_first_token():
    pipe = plan_from_sizes(20, [10, 10])
    m = predict(LLAMA_70B_CUT, H100, pipe, HALVES, DEFAULT_ALLSUM["nccl"], 8192)
    for mode in ("pipeline", "tensor"):
        tps = m[mode]["tokens_per_s"]
        # more streams share each read
        assert set(tps) == {"1", "16", "64"} and tps["1"] < tps["16"] < tps["64"]
        assert m[mode]["first_token_s"] > 0 and m[mode]["kv_capacity_tokens"] >= 8192
    # A long prompt's first token: both devices work on every chunk, if the chunks'
    # all_sums cross fast links.
    fast = predict(LLAMA_70B_CUT, H100, pipe, HALVES, AllSum(0.03, 100.0), 8192)
    slow = predict(LLAMA_70B_CUT, H100, pipe, HALVES, TCP_1MS, 8192)
    assert (
        fast["tensor"]["first_token_s"]
        < fast["pipeline"]["first_token_s"]
        < slow["tensor"]["first_token_s"]
    )
    assert m["tensor"]["allsum_ms_per_token"] == pytest.approx(
        40 * m["tensor"]["allsum_ms"], rel=1e-2
    )
    failed = predict(
        LLAMA_8B, H100, "the model does not fit", "no split", DEFAULT_ALLSUM["ring"], 8192
    )
    assert (
        failed["pipeline"] == {"error": "the model does not fit"}
        and failed["tensor"]["error"] == "no split"
    )


def test_the_table_shows_each_mode_and_why():
    choice = choose(LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"])[3]
    lines = format_modes(choice.modes, choice.reason).splitlines()
    assert lines[0].split()[:4] == ["mode", "1", "stream", "16"]
    assert (
        lines[1].startswith("pipeline ")
        and lines[2].startswith("tensor ")
        and "over NCCL" in lines[2]
    )
    assert f"{choice.modes['tensor']['tokens_per_s']['1']:.2f}" in lines[2]
    assert "default for NCCL" in lines[3] and lines[-1] == f"mode {choice.reason}"
    refused = choose(
        LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"], split="llama cannot be split 2 ways"
    )[3]
    assert "tensor    cannot run: llama cannot be split 2 ways" in format_modes(
        refused.modes, refused.reason
    )


def test_the_planner_takes_each_ranks_share_of_a_layer_from_the_cut():
    assert tensor_shares(LLAMA_CONFIG, 2) == HALVES and tensor_shares(
        LLAMA_CONFIG, 1
    ) == even_sizes(1)
    smol = {
        **LLAMA_CONFIG,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
    }
    two = tensor_shares(smol, 2)  # 6 + 3 heads, 768 + 768 MLP columns
    assert two[0].layer > 0.5 > two[1].layer and sum(p.layer for p in two) == pytest.approx(1.0)
    assert [p.cache for p in two] == [2 / 3, 1 / 3]
    sixteen = tensor_shares(LLAMA_CONFIG, 16)  # 2 query heads each: each KV head kept by 2 ranks
    assert sixteen == [sixteen[0]] * 16 and sixteen[0].layer > 1 / 16 and sixteen[0].cache == 1 / 8
    # one latent cache for every head
    latent = tensor_shares({**LLAMA_CONFIG, "kv_lora_rank": 512}, 2)
    assert [p.cache for p in latent] == [1.0, 1.0]
    with pytest.raises(ValueError, match="32 query heads cannot be shared by 64 ranks"):
        tensor_shares(LLAMA_CONFIG, 64)


def test_the_probe_result_fits_a_latency_and_a_bandwidth(tmp_path):
    lat, gbs, hidden = 0.2e-3, 5e9, 4096
    small = hidden * 2
    result = {
        "hidden": hidden,
        "dtype": "bfloat16",
        "ranks": 2,
        "bytes_per_element": 2,
        "probe": PROBE,
        "rows_1_ms": (lat + small / gbs) * 1e3,
        "rows_64_ms": (lat + 64 * small / gbs) * 1e3,
    }
    a = fit(result, "ring (TCP)")
    assert a.latency_ms == pytest.approx(0.2, abs=1e-3) and a.gbytes_s == pytest.approx(
        5.0, rel=1e-3
    )
    assert a.source.startswith("measured on this ring") and a.ranks == 2
    # no slower with 64 rows: bandwidth beyond the probe
    flat = fit({**result, "rows_64_ms": result["rows_1_ms"]})
    assert flat.latency_ms >= 0 and flat.gbytes_s > 0
    out = "\n".join(
        ["[ring] connecting", json.dumps({"allsum": result}), "rank 1 done", '{"allsum": "broken"}']
    )
    assert parse(out) == result and parse("nothing here") is None
    key = ring_key(["studio", "mini"], "ring")
    assert cached(tmp_path, key) is None
    remember(tmp_path, key, result)
    assert (
        cached(tmp_path, key).latency_ms == a.latency_ms
        and cached(tmp_path, ring_key(["mini", "studio"])) is None
    )
    entries = [{"ssh": "studio"}, {"ssh": "mini"}]
    assert ring_allsum(tmp_path, entries).source.startswith("measured")
    assert ring_allsum(tmp_path / "none", entries) == DEFAULT_ALLSUM["ring"]
    rdma = [{"ssh": "a", "rdma": [None, "rdma_en3"]}, {"ssh": "b", "rdma": ["rdma_en3", None]}]
    assert backend_of(rdma) == "jaccl" and ring_allsum(tmp_path, rdma) == DEFAULT_ALLSUM["jaccl"]
    assert backend_of([{"ssh": "a", "rdma": []}, {"ssh": "c"}]) == "ring"


def test_status_names_the_mode_and_why():
    from mlx_ring.launcher.status import table

    row = {
        "rank": 0,
        "host": "a",
        "layers": [0, 20],
        "holds_embedding": True,
        "parameter_bytes_kib": 1024,
        "rss_kib": 2048,
        "kv_cache_kib": 0,
        "open_sequences": 0,
    }
    s = {
        "model": "m",
        "queued_requests": 0,
        "ranks": [row, {**row, "rank": 1, "holds_embedding": False}],
        "plan": {
            "strategy": "balanced",
            "n_layers": 20,
            "mode": "tensor",
            "mode_reason": "tensor: PARALLEL=tensor",
        },
    }
    lines = table(s).splitlines()
    assert lines[:2] == [
        "model m, plan balanced over 20 layers, tensor mode",
        "  mode tensor: PARALLEL=tensor",
    ]
    del s["plan"]["mode"], s["plan"]["mode_reason"]  # a ring of an older version
    assert table(s).splitlines()[1].split()[0] == "rank"
