"""The plan's memory figure for each rank (`most_gb`, what `plan`, the startup table,
/cluster/status and the benchmark compare a rank's peak with): its weights, its runtime as
estimated (or measured in the warm-up, where more), its prompt cache and the KV room the ring
grants, never more than the memory the plan left for the caches. A GPU of its own is filled from
its own memory. Pure: no MLX."""

import json
from dataclasses import replace

import pytest

from mlx_ring import gpu
from mlx_ring.planning import probe
from mlx_ring.planning.activations import activation_bytes, step_tokens
from mlx_ring.planning.assemble import plan_for, serving
from mlx_ring.planning.capabilities import Capabilities, colocate
from mlx_ring.planning.cluster import Planned, RankFacts
from mlx_ring.planning.cost import kv_room, layer_kv_bytes, memory_need
from mlx_ring.planning.plan import GIB, tensor_plan
from mlx_ring.planning.report import format_summary, summary
from mlx_ring.planning.sizes import spec_from_config
from mlx_ring.planning.split import ShareSize
from mlx_ring.serving.rows import one_request
from mlx_ring.serving.warmup import count_measured, fit_room

# Llama-3-8B's shape cut to 16 layers, bfloat16 (the GPU benchmarks' model)
LLAMA_8B_16 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 49152,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
H100 = Capabilities("gpu", 79.2, 71.3, 700, 3000, "NVIDIA H100 80GB HBM3")
SPEC = serving(spec_from_config(LLAMA_8B_16), 0, 64)


def test_the_figure_counts_the_kv_room_granted_not_kv_tokens():
    plan, caps, kept = plan_for(SPEC, [H100], None, "balanced", 8192, prompt_cache_gb=2.0)
    s = summary(SPEC, caps, plan, 8192, kept=kept)
    (r,) = s["ranks"]
    room = s["kv_capacity_tokens"]
    # The room fills the GPU, far past KV_TOKENS, beside the prefill steps' share
    # (activations.CUDA_SHARE).
    assert room == kv_room(SPEC, caps, plan, 8192) > 90 * 8192
    assert r["kv_room_gb"] == pytest.approx(16 * layer_kv_bytes(SPEC, room) / GIB, abs=1e-3)
    assert r["most_gb"] == pytest.approx(
        r["weights_gb"] + r["runtime_gb"] + r["kv_room_gb"] + 2.0, abs=2e-3
    )
    # `needs_gb` stays what the slice needs with KV_TOKENS (the fit check); the figure is
    # what it may hold.
    assert r["needs_gb"] == round(memory_need(SPEC, caps[0], 0, 16, 8192) / GIB, 3) < r["most_gb"]
    # Never more than the memory the plan left: what the rank may fill, and the
    # prompt cache set aside.
    assert r["most_gb"] <= caps[0].usable_gb + r["prompt_cache_gb"] + 1e-3 == H100.usable_gb + 1e-3
    header, row = format_summary(s).splitlines()[:2]
    assert "KV room" in header and "at most" in header and f"{r['most_gb']:.1f} GB" in row


def test_after_the_warm_up_the_figure_counts_what_was_measured_and_still_fits():
    """Activations measured beyond the plan's runtime come out of the KV room: the figure counts the
    measured runtime and the smaller room, and stays within what the rank may fill."""
    plan, caps, kept = plan_for(SPEC, [H100], None, "balanced", 8192, prompt_cache_gb=2.0)
    s = summary(SPEC, caps, plan, 8192, kept=kept)
    room = s["kv_capacity_tokens"]
    before = s["ranks"][0]
    measured_gib = before["runtime_gb"] + 2.5  # the warm-up took 2.5 GiB more than estimated
    status = [
        {
            "mlx_peak_memory_kib": int((before["weights_gb"] + measured_gib + 0.1 + 0.2) * 2**20),
            "kv_cache_peak_kib": int(0.1 * 2**20),
            "prompt_cache_kib": int(0.2 * 2**20),
        }
    ]
    view = Planned(**{k: v for k, v in before.items() if k not in ("rank", "host", "layers")})
    ranks = (
        RankFacts(
            0, "gpu", (0, 16), parameter_bytes_kib=int(before["weights_gb"] * 2**20), planned=view
        ),
    )
    fitted = fit_room(SPEC, ranks, status, room, 8192)
    assert fitted < room
    (counted,) = count_measured(SPEC, ranks, status, fitted)
    r = counted.planned
    assert (
        r.runtime_gb == pytest.approx(measured_gib, abs=2e-3)
        and r.measured_runtime_gb == r.runtime_gb
    )
    assert r.kv_room_gb == pytest.approx(16 * layer_kv_bytes(SPEC, fitted) / GIB, abs=1e-3)
    assert r.kv_room_gb == pytest.approx(before["kv_room_gb"] - 2.5, abs=1e-2)
    assert r.most_gb == pytest.approx(before["most_gb"], abs=1e-2)
    assert r.most_gb <= H100.usable_gb + 1e-3
    # /cluster/status shows them
    assert {"kv_room_gb": r.kv_room_gb, "most_gb": r.most_gb}.items() <= counted.to_json().items()


def test_a_tensor_ranks_figure_counts_its_share_of_every_layers_kv_room():
    """In tensor mode every rank holds its share of each layer's cache (split by heads): its
    KV room is that share of all the layers' caches for the room the ring grants, within
    what it may fill."""
    caps = [replace(H100, usable_gb=60.0), replace(H100, usable_gb=60.0)]
    # even parts where none are given
    s = summary(SPEC, caps, tensor_plan(16, 2), 8192, kept=[1.0, 1.0])
    room = s["kv_capacity_tokens"]
    assert s["mode"] == "tensor" and room > 100 * 8192
    for r in s["ranks"]:
        assert r["share"] == r["cache_share"] == 0.5 and r["prompt_cache_gb"] == 1.0
        assert r["kv_room_gb"] == pytest.approx(
            16 * 0.5 * layer_kv_bytes(SPEC, room) / GIB, abs=1e-3
        )
        assert r["most_gb"] == pytest.approx(
            r["weights_gb"] + r["runtime_gb"] + r["kv_room_gb"] + 1.0, abs=2e-3
        )
        assert r["most_gb"] <= 60.0 + 1.0 + 1e-3
    header, *rows = format_summary(s).splitlines()[:3]
    assert "KV room" in header and all(
        f"{r['most_gb']:.1f} GB" in row for r, row in zip(s["ranks"], rows)
    )
    # A rank keeping more of the cache than of the weights (KV heads kept by several ranks) grants
    # the room from it.
    kept_twice = summary(
        SPEC,
        caps,
        tensor_plan(16, 2),
        8192,
        shares=[ShareSize(0.5, 1.0), ShareSize(0.5, 0.5)],
        kept=[1.0, 1.0],
    )
    first, second = kept_twice["ranks"]
    assert kept_twice["kv_capacity_tokens"] < room and first["kv_room_gb"] == pytest.approx(
        2 * second["kv_room_gb"], abs=2e-3
    )


def test_the_runtime_and_the_prefill_cap_count_the_same_tokens():
    """One function says how many tokens of forward work a rank holds at once: the activation figure
    counts that many, and the scheduler's prefill budget is that many."""
    for chunk, rows in ((0, 64), (512, 64), (128, 16), (128, 1024)):
        spec = serving(SPEC, chunk, rows)
        assert step_tokens(spec) == max(chunk or 512, rows)
        # no attention scores, no head: the layers' arrays alone
        lean = replace(spec, heads=0, vocab=0)
        tokens = step_tokens(lean, H100, 1, 16, 8192)  # a CUDA rank's: more, in whole chunks
        assert tokens >= step_tokens(spec) and tokens % (chunk or 512) == 0
        assert activation_bytes(lean, H100, 1, 16, 8192) == 16 * tokens * spec.act_bytes_per_token


def test_a_cuda_rank_fills_its_gpus_memory_not_the_hosts(monkeypatch, tmp_path):
    """MLX's CUDA `device_info()` has `total_memory` and `free_memory`: the GPU's. A rank
    there may fill what is free, at most 90% of the card, whatever the host has (128 GiB
    beside an 80 GB H100)."""
    info = {
        "device_name": "NVIDIA H100 80GB HBM3",
        "architecture": "sm_90",
        "total_memory": 85_028_896_768,
        "free_memory": 84_398_669_824,
    }
    assert gpu.own_memory(info) == (85_028_896_768, 84_398_669_824)
    assert gpu.own_memory({"device_name": "AMD EPYC", "architecture": "x86_64"}) is None  # a CPU
    # a Mac
    assert (
        gpu.own_memory(
            {"memory_size": 68719476736, "max_recommended_working_set_size": 51539607552}
        )
        is None
    )
    assert gpu.usable_own(80 * GIB, 79 * GIB) == int(0.9 * 80 * GIB)
    assert gpu.usable_own(80 * GIB, 30 * GIB) == 30 * GIB  # another process holds the rest
    monkeypatch.setattr(probe, "device_info", lambda: info)
    monkeypatch.setattr(probe, "os_memory", lambda: (128 * GIB, 120 * GIB))
    monkeypatch.setenv("MLX_RING_CAPS", json.dumps([{"tflops": 700, "bandwidth_gbs": 3000}]))
    cap = probe.local_capabilities(tmp_path, "bfloat16", 0)
    assert cap.device == "NVIDIA H100 80GB HBM3"
    assert cap.memory_gb == pytest.approx(85_028_896_768 / GIB)
    assert cap.usable_gb == pytest.approx(0.9 * 85_028_896_768 / GIB)


def test_ranks_with_a_gpu_each_do_not_share_its_memory():
    one = replace(H100, usable_gb=70.0)
    apart = colocate([replace(one, unit="GPU 0"), replace(one, unit="GPU 1")])
    assert [c.usable_gb for c in apart] == [70.0, 70.0]
    shared = colocate([one, one])  # two ranks on one GPU
    assert [c.usable_gb for c in shared] == [35.0, 35.0]


def test_one_request_alone_may_hold_half_the_room():
    """Growing copies a cache whole, so a request alone holds its cache twice
    over at that moment."""
    assert one_request(800, 256, 0) == 144
    assert one_request(800, 256, 6) == 138  # its drafts too
    # never nothing: the API then refuses every request by name
    assert one_request(300, 256, 0) == 1
