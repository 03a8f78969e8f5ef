"""PARALLEL=auto's choice between the pipeline and tensor mode, and the settings that fix it: pure,
no MLX, on the shapes measured on 2 x H100 (modeshapes.py); and the launcher's own choice from
the model's config, hosts.json and the cached all_sum."""

import json
from dataclasses import replace

import pytest
from modeshapes import H100, H100_4, HALVES, LLAMA_8B, LLAMA_70B_CUT, LLAMA_CONFIG, TCP_1MS, choose

from mlx_ring.planning.auto import decide, plan_mode, shares_or_refusal
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import DEFAULT_ALLSUM, AllSum, tensor_parts
from mlx_ring.planning.plan import GIB, ModelSpec
from mlx_ring.planning.split import even_sizes

# 9 layers of the Llama-405B shape, bfloat16: 3.19B parameters a layer, a 128256 x
# 16384 embedding and head.
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
ULTRAS = [Capabilities(f"ultra-{i}", 192, 150, 28, 800, "Apple M3 Ultra") for i in (1, 2)]


def ratio(choice) -> float:
    return (
        choice.modes["tensor"]["tokens_per_s"]["1"] / choice.modes["pipeline"]["tokens_per_s"]["1"]
    )


def test_tensor_wins_where_the_device_bounds_the_step_by_more_than_the_hosts_work():
    # Two Mac Studios over Thunderbolt 5: reading 34 GB a token takes 43 ms on one, a share
    # of it half that.
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
    # (measured: tensor-4 2.83x ring-1 on 4 x H100; NCCL's all_sums on four ranks are
    # scaled from two's, slower).
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
