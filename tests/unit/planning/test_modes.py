"""Each mode's predictions and PARALLEL=auto's choice: pure, no MLX. The shapes are those
measured on 2 x H100 (mlx-lm's shard() under mlx.launch): the Llama-3-8B shape over `--backend
ring` ran at 0.11-0.31x one GPU, a 20-layer cut of the Llama-70B shape over NCCL at 1.60x."""

import json
from dataclasses import replace

import pytest

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
from mlx_ring.planning.auto import decide, format_modes, plan_mode, predict, shares_or_refusal
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import (
    DEFAULT_ALLSUM,
    AllSum,
    embed_bytes,
    tensor_kv_room,
    tensor_need,
    tensor_parts,
)
from mlx_ring.planning.plan import GIB, ModelSpec, plan_from_sizes
from mlx_ring.planning.split import ShareSize, even_sizes, tensor_shares

# Llama-3-8B, bfloat16: 218M parameters a layer, 525M in each of the embedding and the head.
LLAMA_8B = ModelSpec(
    32,
    436e6,
    2 * 1.05e9,
    1.05e9,
    4096,
    436e6,
    2 * 218e6,
    2 * 525e6,
    "bfloat16",
    "8b",
    hidden_bytes=4096 * 2,
)
# 20 layers of the Llama-70B shape, bfloat16: 856M parameters a layer, a 128256 x 8192 embedding and
# head.
LLAMA_70B_CUT = ModelSpec(
    20,
    1.712e9,
    2 * 2.1e9,
    2.1e9,
    4096,
    1.712e9,
    2 * 856e6,
    2 * 1.05e9,
    "bfloat16",
    "70b-20",
    hidden_bytes=8192 * 2,
)
# 9 layers of the Llama-405B shape, bfloat16: 3.19B parameters a layer, a 128256 x 16384 embedding
# and head.
LLAMA_405B_CUT = ModelSpec(
    9,
    6.375e9,
    2 * 4.2e9,
    4.2e9,
    4096,
    6.375e9,
    2 * 3.19e9,
    2 * 2.1e9,
    "bfloat16",
    "405b-9",
    hidden_bytes=16384 * 2,
)
H100_4 = [
    Capabilities("gpu-box", 80, 70, 500, 2800, "NVIDIA H100", unit=f"GPU {i}") for i in range(4)
]
H100 = H100_4[:2]
ULTRAS = [Capabilities(f"ultra-{i}", 192, 150, 28, 800, "Apple M3 Ultra") for i in (1, 2)]
LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
HALVES = even_sizes(2)
TCP_1MS = AllSum(1.0, 1.25, 2, "ring (TCP)", "as measured on 2 x H100 through the host")


def choose(spec, caps, allsum, parallel="auto", split=None, **kw):
    n = len(caps)
    return plan_mode(
        spec,
        caps,
        None,
        parallel,
        "balanced",
        8192,
        split=split or even_sizes(n),
        allsum=allsum,
        **kw,
    )


def ratio(choice) -> float:
    return (
        choice.modes["tensor"]["tokens_per_s"]["1"] / choice.modes["pipeline"]["tokens_per_s"]["1"]
    )


def test_tensor_wins_where_the_device_bounds_the_step_by_more_than_the_hosts_work():
    # Two Mac Studios over Thunderbolt 5: reading 34 GB a token takes 43 ms on one, a share of it
    # half that.
    plan, _, _, choice = choose(LLAMA_70B_CUT, ULTRAS, DEFAULT_ALLSUM["jaccl"])
    assert (
        choice.mode == "tensor"
        and plan.mode == "tensor"
        and plan.tensor == 2
        and plan.ranges == ((0, 20),)
    )
    assert 1.3 < ratio(choice) < 1.8
    assert (
        choice.reason.startswith("tensor: 2 ranks, all_sum")
        and "JACCL" in choice.reason
        and "x the pipeline's" in choice.reason
    )


def test_the_hosts_work_per_step_decides_on_fast_gpus():
    # On H100s the same cut reads in 12-13 ms on one GPU; a tensor rank's host builds the next step
    # (about 6 ms of its thread) while its device runs this one: tensor-2 measured 1.62x ring-1 for
    # one stream on 2 x H100 (docs/benchmarks.md, the header link).
    _, _, _, choice = choose(LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"])
    assert choice.mode == "tensor" and 1.4 <= ratio(choice) < 1.8
    assert "the pipeline's one stream" in choice.reason
    # Layers of 6.4 GB: one GPU reads the 9-layer cut in about 20 ms, a quarter of it in 5
    # (measured: tensor-4 2.83x ring-1 on 4 x H100; NCCL's all_sums on four ranks are scaled from
    # two's, slower).
    _, _, _, choice = choose(LLAMA_405B_CUT, H100_4, DEFAULT_ALLSUM["nccl"])
    assert choice.mode == "tensor" and 2.2 <= ratio(choice) < 3.2
    # Where the headers come through MLX (JACCL), the host's build is added to the step instead.
    hidden = tensor_parts(LLAMA_70B_CUT, H100, HALVES, 1, DEFAULT_ALLSUM["nccl"])
    added = tensor_parts(
        LLAMA_70B_CUT,
        H100,
        HALVES,
        1,
        replace(DEFAULT_ALLSUM["nccl"], transport="JACCL (Thunderbolt)"),
    )
    assert hidden["host"] == 0.0 and added["host"] == pytest.approx(20 * 0.12e-3)
    # The 8B shape reads in 6 ms on one GPU: the host's work would be most of a tensor step
    # (mlx-lm's own shard() loop measured 0.61x one GPU on 2 x H100).
    _, _, _, choice = choose(LLAMA_8B, H100, DEFAULT_ALLSUM["nccl"])
    assert choice.mode == "pipeline" and 0.45 < ratio(choice) < 0.8


def test_the_pipeline_stays_where_all_sums_cross_tcp():
    plan, _, _, choice = choose(LLAMA_8B, H100, TCP_1MS)
    # rank 0 runs the head
    assert choice.mode == "pipeline" and plan.mode == "pipeline" and plan.sizes == [15, 17]
    assert ratio(choice) < 0.35  # measured: 0.11-0.31x
    # 64 all_sums a token at about 1 ms each
    assert choice.reason.startswith(
        "pipeline: all_sum 1.01 ms over ring (TCP) would cost 64.4 ms a token"
    )
    # the default for TCP
    assert choose(LLAMA_8B, H100, DEFAULT_ALLSUM["ring"])[3].mode == "pipeline"
    # even on the device-bound shape
    assert choose(LLAMA_70B_CUT, H100, TCP_1MS)[3].mode == "pipeline"


def test_ranks_sharing_one_device_gain_nothing_from_tensor_mode():
    # no unit of their own: they take turns on the cores
    cpu = [Capabilities("box", 64, 40, 0.1, 20)] * 2
    choice = choose(LLAMA_8B, cpu, DEFAULT_ALLSUM["jaccl"])[3]
    parts = tensor_parts(LLAMA_8B, cpu, HALVES, 1, DEFAULT_ALLSUM["jaccl"])
    alone = tensor_parts(LLAMA_8B, cpu[:1], even_sizes(1), 1, DEFAULT_ALLSUM["jaccl"])
    assert parts["compute"] == pytest.approx(alone["compute"]) and choice.mode == "pipeline"


def test_a_gain_under_the_margin_keeps_the_pipeline():
    modes = {
        "pipeline": {"error": "", "tokens_per_s": {"1": 100.0}},
        "tensor": {
            "error": "",
            "tokens_per_s": {"1": 105.0},
            "allsum_ms": 0.03,
            "allsum_ms_per_token": 1.9,
            "transport": "JACCL (Thunderbolt)",
        },
    }
    mode, reason = decide("auto", 2, modes)
    assert mode == "pipeline" and "only 1.050x" in reason and "1.1x it must gain" in reason
    modes["tensor"]["tokens_per_s"]["1"] = 170.0
    assert decide("auto", 2, modes) == (
        "tensor",
        "tensor: 2 ranks, all_sum 0.03 ms over JACCL (Thunderbolt); "
        "predicted 1.70x the pipeline's one stream",
    )


def test_unequal_memory_takes_the_pipeline_and_names_the_small_host():
    studio = Capabilities("studio", 48, 36, 17, 480)
    mini = Capabilities("mini", 16, 16 * 2 / 3, 3.5, 100)
    spec_14b = ModelSpec(
        48,
        0.51 * GIB,
        2.9 * GIB,
        1.45 * GIB,
        2048,
        0.51 * GIB,
        2 * 0.27e9,
        2 * 0.78e9,
        "bfloat16",
        "14b",
        hidden_bytes=5120 * 2,
    )
    plan, _, _, choice = choose(spec_14b, [studio, mini], DEFAULT_ALLSUM["jaccl"])
    assert choice.mode == "pipeline" and plan.mode == "pipeline"
    assert (
        choice.reason.startswith("pipeline: tensor mode needs")
        and "on mini (rank 1" in choice.reason
    )
    assert "10.7 GB usable" in choice.reason
    with pytest.raises(ValueError, match="PARALLEL=tensor: tensor mode needs .* on mini"):
        choose(spec_14b, [studio, mini], DEFAULT_ALLSUM["jaccl"], parallel="tensor")


def test_a_model_that_does_not_split_takes_the_pipeline_with_the_sentence():
    split = shares_or_refusal(
        {**LLAMA_CONFIG, "num_attention_heads": 3, "num_key_value_heads": 1}, 4
    )
    assert split == (
        "llama can't be split for tensor mode: 3 query heads cannot be shared by 4 ranks; "
        "use PARALLEL=pipeline"
    )
    choice = choose(LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"], split=split)[3]
    assert choice.mode == "pipeline" and choice.reason == f"pipeline: {split}"
    with pytest.raises(
        ValueError,
        match=(
            "PARALLEL=tensor: llama can't be split for tensor mode.*use PARALLEL=auto or pipeline"
        ),
    ):
        choose(LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"], parallel="tensor", split=split)
    assert shares_or_refusal(None, 2).startswith("the model's config.json was not read")


def test_settings_that_fix_the_mode_or_the_split_are_kept():
    assert (
        choose(LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"], parallel="pipeline")[3].reason
        == "pipeline: PARALLEL=pipeline"
    )
    # asked for, though slower
    assert choose(LLAMA_8B, H100, TCP_1MS, parallel="tensor")[0].tensor == 2
    fixed = plan_mode(
        LLAMA_70B_CUT,
        H100,
        None,
        "auto",
        "balanced",
        8192,
        layers=(12, 8),
        split=HALVES,
        allsum=DEFAULT_ALLSUM["nccl"],
    )
    assert (
        fixed[0].sizes == [12, 8] and fixed[3].reason == "pipeline: LAYERS fixes a pipeline's split"
    )
    one = choose(LLAMA_8B, H100[:1], DEFAULT_ALLSUM["nccl"])[3]
    assert one.mode == "pipeline" and one.reason == "pipeline: one rank, nothing to share"
    with pytest.raises(ValueError, match="PARALLEL='hybrid' is not known"):
        choose(LLAMA_8B, H100, TCP_1MS, parallel="hybrid")


def test_the_launchers_plan_keeps_its_mode_on_every_rank():
    """RING_PLAN of one stage on several ranks is a tensor plan; of a stage a rank, a pipeline's."""
    plan, _, _, choice = choose(LLAMA_8B, H100, TCP_1MS, provisioned=("balanced", [32]))
    # not what TCP says
    assert (
        plan.tensor == 2 and choice.reason == "tensor: as the launcher planned it (PARALLEL=auto)"
    )
    plan, _, _, choice = choose(
        LLAMA_70B_CUT, ULTRAS, DEFAULT_ALLSUM["jaccl"], provisioned=("balanced", [20])
    )
    # the same inputs: its reason
    assert plan.tensor == 2 and choice.reason.startswith("tensor: 2 ranks, all_sum")
    plan, _, _, choice = choose(
        LLAMA_70B_CUT, ULTRAS, DEFAULT_ALLSUM["jaccl"], provisioned=("balanced", [11, 9])
    )
    assert plan.sizes == [11, 9] and plan.mode == "pipeline" and choice.mode == "pipeline"
    assert choice.reason == "pipeline: as the launcher planned it (PARALLEL=auto)"
    split = "llama cannot be split 2 ways"
    # a tensor plan shipped for a model this build cannot split
    with pytest.raises(ValueError, match=split):
        choose(
            LLAMA_70B_CUT, H100, DEFAULT_ALLSUM["nccl"], provisioned=("balanced", [20]), split=split
        )


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
    # A long prompt's first token: both devices work on every chunk, if the chunks' all_sums cross
    # fast links.
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


def test_the_dry_run_prints_each_mode_and_the_choice(tmp_path, capsys):
    """`./launch.sh plan` on two Macs cabled for RDMA: tensor mode, each mode's tokens/s and why."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                **LLAMA_CONFIG,
                "hidden_size": 8192,
                "intermediate_size": 28672,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "torch_dtype": "bfloat16",
            }
        )
    )
    ultra = {"memory_gb": 192, "tflops": 28, "bandwidth_gbs": 800}
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {"ssh": "ultra-1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en5"], **ultra},
                {"ssh": "ultra-2", "ips": ["10.0.0.2"], "rdma": ["rdma_en5", None], **ultra},
            ]
        )
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--layers",
        "",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--parallel",
        "auto",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out.splitlines()
    assert f"plan tensor for {hosts}:" in text
    table = text.index(next(x for x in text if x.startswith("mode ") and "1 stream" in x))
    assert text[table + 1].startswith("pipeline ") and text[table + 2].startswith("tensor ")
    assert "over JACCL (Thunderbolt)" in text[table + 2]
    assert (
        text[table + 4].startswith("mode tensor: 2 ranks, all_sum 0.0")
        and "x the pipeline's one stream" in text[table + 4]
    )
    assert any(
        x.startswith("other pipelines: balanced 39/41") and "uniform 40/40" in x for x in text
    )
    assert any("the all_sum was not measured on this ring" in x for x in text)
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "tensor" and d["mode_reason"] == text[table + 4][len("mode ") :]
    assert [r["layers"] for r in d["ranks"]] == [[0, 80], [0, 80]] and [
        r["share"] for r in d["ranks"]
    ] == [0.5, 0.5]
    assert d["modes"]["tensor"]["tokens_per_s"]["1"] == d["predicted_tokens_per_s"]
    assert main([*args, "--parallel", "pipeline", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (
        d["mode"] == "pipeline"
        and d["mode_reason"] == "pipeline: PARALLEL=pipeline"
        and d["ranks"][0]["layers"] == [0, 39]
    )


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


def test_the_launcher_chooses_and_knows_when_auto_would_guess(tmp_path):
    """up.py's plan: the mode from the model's config, hosts.json and the cached all_sum."""
    from types import SimpleNamespace

    from mlx_ring.config import parse_config
    from mlx_ring.hostfile import load_hosts
    from mlx_ring.launcher.collectives import choose, unmeasured

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(
        json.dumps(
            {
                **LLAMA_CONFIG,
                "num_hidden_layers": 20,
                "hidden_size": 8192,
                "num_attention_heads": 64,
            }
        )
    )
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            [{"ssh": "10.0.0.1", "ips": ["10.0.0.1"]}, {"ssh": "10.0.0.2", "ips": ["10.0.0.2"]}]
        )
    )
    cfg, _ = parse_config(
        [
            "--hostfile",
            str(hostfile),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--layers",
            "",
            "--parallel",
            "auto",
            "--prompt-cache-gb",
            "0",
        ]
    )
    hosts = load_hosts(hostfile, 40000, resolver=lambda name: name, here=lambda *_: False)
    ring = SimpleNamespace(
        cfg=cfg,
        spec=LLAMA_70B_CUT,
        model=tmp_path / "model",
        hosts=hosts,
        measured=H100,
        problems=[],
        allsum=None,
        links=None,
        split="",
        plan=None,
        caps=None,
        choice=None,
    )
    choose(ring)
    assert (
        ring.split == HALVES
        and ring.allsum == DEFAULT_ALLSUM["ring"]
        and ring.choice.mode == "pipeline"
    )
    assert unmeasured(ring)  # a first start measures before it ships the plan
    ring.measured = [Capabilities("box", 64, 40, 0.1, 20)] * 2
    # ranks taking turns on one device: tensor mode cannot pay, nothing to measure
    assert not unmeasured(ring)
    ring.measured = ULTRAS
    # as check measures RDMA
    ring.allsum = AllSum(0.03, 6.0, 2, "JACCL (Thunderbolt)", "measured on this ring")
    choose(ring)
    assert ring.choice.mode == "tensor" and ring.plan.tensor == 2 and not unmeasured(ring)
