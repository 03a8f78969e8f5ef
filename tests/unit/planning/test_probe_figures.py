"""What the probes keep of what they time, and when a figure they cached is measured again: on
numbers recorded on a 2-core Linux machine, where tensor-2 on the default model (float32, a core
per rank) decoded one stream 1.26x faster than one rank and 1.21x faster than pipeline-2
(docs/benchmarks.md), yet PARALLEL=auto had chosen the pipeline from a cached all_sum of 28.6 ms."""

import json

import pytest

from mlx_ring.planning.allsum import (
    PROBE,
    cached,
    fit,
    implausible,
    kept,
    remember,
    ring_allsum,
    ring_key,
)
from mlx_ring.planning.auto import plan_mode
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import DEFAULT_ALLSUM, tensor_parts
from mlx_ring.planning.plan import ModelSpec
from mlx_ring.planning.split import ShareSize

# The default model (SmolLM2-135M as float32) as sizes.py reads it, split 6 + 3 heads over 2 ranks.
SMOL = ModelSpec(
    30,
    14160384.0,
    113248512,
    113246208,
    1536,
    14160384.0,
    7080192.0,
    56623104.0,
    "float32",
    "smol",
    hidden_bytes=2304,
    act_bytes_per_token=44544.0,
    heads=9,
    vocab=49152,
    context_length=8192,
)
SHARES = [ShareSize(0.5416666666666666, 2 / 3), ShareSize(0.4583333333333333, 1 / 3)]
# One core each (as `bench --pin` runs them), as the speed probe measured a core:
# best of its rounds.
PINNED = [
    Capabilities("vm", 23.5, 10.4, 0.0962, 4.80, "AMD EPYC", unit=f"cores {r}") for r in (0, 1)
]
# allsum.json as the old probe left it on that machine (check's probe, mlx.launch spinning
# a core beside it).
OLD_CACHE = {
    "ring|127.0.0.1,127.0.0.1": {
        "hidden": 576,
        "dtype": "float32",
        "ranks": 2,
        "bytes_per_element": 4,
        "rows_1_ms": 28.576970000358415,
        "rows_64_ms": 29.281334000188508,
        "measured": "2026-11-27 02:38",
    }
}
# The probe now, on the same machine: the lower quartile of 12 rounds (their medians
# 0.300 and 0.148 ms).
NOW = {
    "hidden": 576,
    "dtype": "float32",
    "ranks": 2,
    "bytes_per_element": 4,
    "probe": PROBE,
    "rounds": 12,
    "rows_1_ms": 0.0822,
    "rows_64_ms": 0.140,
    "rows_1_median_ms": 0.300,
    "rows_64_median_ms": 0.148,
}
KEY = ring_key(["127.0.0.1", "127.0.0.1"])


def choose(allsum):
    return plan_mode(SMOL, PINNED, None, "auto", "balanced", 8192, split=SHARES, allsum=allsum)[3]


def test_a_stalled_round_does_not_set_the_all_sums_figure():
    # Rounds of 16 chained (1, 576) all_sums on that machine, ms each, the first
    # two being the warm-up.
    rounds = [
        9.16,
        9.57,
        2.39,
        0.23,
        0.75,
        0.56,
        0.55,
        0.79,
        0.71,
        11.75,
        1.56,
        5.05,
        1.92,
        0.09,
        0.10,
        0.11,
    ]
    old = sorted(rounds[:5])[2]  # the median of five rounds, warm-up and all
    assert old == pytest.approx(2.39)
    assert kept(rounds[2:]) == pytest.approx(0.23)  # the lower quartile, past the warm-up
    assert kept([0.3]) == 0.3 and kept([0.5, 0.1]) == 0.1


def test_a_figure_the_old_probe_cached_is_measured_again(tmp_path):
    (tmp_path / "allsum.json").write_text(json.dumps(OLD_CACHE))
    assert implausible(OLD_CACHE[KEY]).startswith("measured by an older probe")
    # so a start with PARALLEL=auto measures it (planner.plan_ring)
    assert cached(tmp_path, KEY) is None
    assert ring_allsum(tmp_path, [{"ssh": "127.0.0.1"}] * 2) == DEFAULT_ALLSUM["ring"]
    remember(tmp_path, KEY, NOW)
    again = cached(tmp_path, KEY)
    assert again is not None and again.source.startswith("measured on this ring")
    assert again.latency_ms == pytest.approx(0.0813, abs=1e-3)


def test_a_small_array_far_slower_than_a_big_one_says_stalls_were_timed(tmp_path):
    # Recorded there too: 15.2 ms for (1, 576) against 1.03 ms for (64, 576),
    # and 0.842 against 0.312.
    for one, many in ((15.243565499986289, 1.0328577500331448), (0.842, 0.312)):
        row = {**NOW, "rows_1_ms": one, "rows_64_ms": many}
        assert "stalls were timed" in implausible(row)
        remember(tmp_path, KEY, row)
        assert cached(tmp_path, KEY) is None
    assert (
        implausible(NOW) == "" and implausible({**NOW, "rows_1_ms": 0.2, "rows_64_ms": 0.15}) == ""
    )


def test_the_launcher_measures_again_before_it_ships_a_plan(tmp_path):
    """A first `./launch.sh start` measures the all_sum where auto would choose without one: also
    where the cache holds a figure the old probe left."""
    from types import SimpleNamespace

    from mlx_ring.config import parse_config
    from mlx_ring.hostfile import load_hosts
    from mlx_ring.launcher.collectives import choose as launcher_choose
    from mlx_ring.launcher.collectives import unmeasured

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "allsum.json").write_text(json.dumps(OLD_CACHE))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 576,
                "intermediate_size": 1536,
                "num_hidden_layers": 30,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "vocab_size": 49152,
            }
        )
    )
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    cfg, _ = parse_config(
        [
            "--hostfile",
            str(hostfile),
            "--cache-dir",
            str(cache),
            "--layers",
            "",
            "--parallel",
            "auto",
            "--prompt-cache-gb",
            "0",
        ]
    )
    hosts = load_hosts(hostfile, 40000, resolver=lambda name: name, here=lambda *_: True)
    ring = SimpleNamespace(
        cfg=cfg,
        spec=SMOL,
        model=model,
        hosts=hosts,
        measured=PINNED,
        problems=[],
        allsum=None,
        links=None,
        split="",
        plan=None,
        caps=None,
        choice=None,
    )
    launcher_choose(ring)
    assert not ring.problems and unmeasured(ring)


def test_two_pinned_cores_choose_tensor_mode_with_the_all_sum_a_step_pays():
    now = choose(fit(NOW))
    assert now.mode == "tensor" and now.reason.startswith("tensor: 2 ranks, all_sum 0.08")
    ratio = now.modes["tensor"]["tokens_per_s"]["1"] / now.modes["pipeline"]["tokens_per_s"]["1"]
    assert 1.1 <= ratio < 1.5  # measured: 1.21x pipeline-2's one stream
    old = choose(fit(OLD_CACHE[KEY]))
    assert old.mode == "pipeline" and old.reason.startswith("pipeline: all_sum 28.6 ms")


def test_the_cpu_compute_terms_match_the_measured_steps():
    """Each mode's one-stream step on the pinned cores, against the inter-token latencies measured
    (medians: ring-1 81.2 ms, pipeline-2 78.6 ms, tensor-2 64.4 ms): the probe's bandwidth reads a
    little slow for both, so the ratio, not the times, is what the choice rests on."""
    a = fit(NOW)
    parts = tensor_parts(SMOL, PINNED, SHARES, 1, a)
    tensor = sum(parts.values())
    pipeline = 1 / choose(a).modes["pipeline"]["tokens_per_s"]["1"]
    # The larger share bounds a layer: 54% of one core's read of it.
    whole = SMOL.layer_read_bytes / (PINNED[0].bandwidth_gbs * 1e9)
    assert parts["compute"] == pytest.approx(SMOL.n_layers * SHARES[0].layer * whole, rel=1e-6)
    assert tensor / pipeline == pytest.approx(64.4 / 78.6, abs=0.1)
    # Both slow by about one factor: the probe read 4.8 GB/s where decoding the 538 MB reached 6.6.
    assert 1.2 < tensor * 1e3 / 64.4 < 1.5 and 1.2 < pipeline * 1e3 / 78.6 < 1.5


def test_a_speed_the_old_probe_cached_is_measured_again(tmp_path):
    """The speed probe keeps its fastest round; a figure cached by its old way (one mean,
    here taken while other work ran: half what one pinned core of the machine measured
    later) is measured again."""
    import socket

    from mlx_ring.planning.probe import SPEED_PROBE, _cached_speed, blas

    old = {
        "tflops": 0.04992188373469452,
        "bandwidth_gbs": 2.361560284295222,
        "measured": "2026-11-26 23:48:55",
    }
    path = tmp_path / "probe.json"
    key = f"{socket.gethostname()}|{{}}|float32{blas()}"
    path.write_text(
        json.dumps(
            {
                key.format("old"): old,
                key.format("new"): {"tflops": 7.0, "bandwidth_gbs": 70.0, "probe": SPEED_PROBE},
            }
        )
    )
    assert _cached_speed(tmp_path, "new", "float32") == (7.0, 70.0)  # read back as it was
    tflops, gbs = _cached_speed(tmp_path, "old", "float32")
    again = json.loads(path.read_text())[key.format("old")]
    assert again["probe"] == SPEED_PROBE and again["measured"] != old["measured"]
    assert (tflops, gbs) == (again["tflops"], again["bandwidth_gbs"]) and tflops > 0 and gbs > 0
    assert _cached_speed(tmp_path, "old", "float32") == (tflops, gbs)  # and read back from then on


def test_the_dry_run_plans_each_rank_as_its_own_probe_says(tmp_path, capsys, monkeypatch):
    """`./launch.sh plan` takes each undeclared rank as `check`'s probes and the ranks take it:
    its own MLX_RING_CAPS entry (here the core it is pinned to), not rank 0's for every one."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "smol"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 576,
                "intermediate_size": 1536,
                "num_hidden_layers": 30,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "vocab_size": 49152,
                "tie_word_embeddings": True,
                "torch_dtype": "float32",
            }
        )
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    remember(tmp_path / "cache", KEY, NOW)
    core = {"memory_gb": 23.5, "usable_gb": 10.4, "tflops": 0.0962, "bandwidth_gbs": 4.80}
    monkeypatch.setenv(
        "MLX_RING_CAPS", json.dumps([{**core, "unit": f"cores {r}"} for r in (0, 1)])
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--layers",
        "",
        "--prompt-cache-gb",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--parallel",
        "auto",
        "--json",
    ]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "tensor" and d["modes"]["tensor"]["allsum_from"].startswith(
        "measured on this ring"
    )


def test_a_figure_measured_over_nccl_is_the_one_a_cuda_ring_plans_with(tmp_path):
    # A CUDA ring runs tensor mode's all_sums over NCCL: its probe caches them under "nccl", and the
    # planner reads that figure, or NCCL's default, never the ring backend's.
    hosts = [{"ssh": "127.0.0.1"}] * 2
    assert ring_allsum(tmp_path, hosts, "nccl") == DEFAULT_ALLSUM["nccl"]
    assert ring_allsum(tmp_path, hosts) == DEFAULT_ALLSUM["ring"]
    remember(tmp_path, KEY, NOW)
    remember(
        tmp_path,
        ring_key(["127.0.0.1"] * 2, "nccl"),
        {**NOW, "rows_1_ms": 0.047, "rows_64_ms": 0.054},
    )
    over_nccl = ring_allsum(tmp_path, hosts, "nccl")
    assert over_nccl.transport == "NCCL" and over_nccl.source.startswith("measured on this ring")
    # the launcher, which cannot see the GPUs: the NCCL figure wins
    assert ring_allsum(tmp_path, hosts) == over_nccl
    assert ring_allsum(tmp_path, hosts, "ring").transport == "ring (TCP)"
