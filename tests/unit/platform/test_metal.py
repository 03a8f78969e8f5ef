"""Apple Silicon as MLX and mlx-lm use it, decided from recorded Macs on any machine: the memory
Metal lets a rank wire, the refusal of a slice beyond it, and the command-buffer watchdog (which
payloads a rank receives apart, how many prompt tokens go in a prefill step)."""

from dataclasses import replace

import mlx.core as mx
import pytest

from mlx_ring.config import parse_config
from mlx_ring.gpu import (
    PREFILL_SHARE,
    STAGE_BUDGET_S,
    WATCHDOG_S,
    host_reads_move_pages,
    receive_apart_setting,
    usable_bytes,
    watchdog_chunk,
    wired_limit_mb,
    working_set,
)
from mlx_ring.planning.capabilities import Capabilities, default_usable_gb, with_host_keys
from mlx_ring.planning.cluster import Cluster, PlanFacts, Planned, RankFacts
from mlx_ring.planning.plan import GIB, ModelSpec
from mlx_ring.planning.strategies import plan_layers
from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.transport import Ring, in_graph, receives_apart
from mlx_ring.serving import startup

# `mx.device_info()` as Macs report it. A 16 GB Apple M1 (macOS 13.7.8, mlx 0.29.3's
# `mx.metal.device_info()`), from a public benchmark receipt found with the code search (its
# repository was not named there); exo-explore/exo#1672 reports the same "~10.67 GB" for a 16 GB
# Mac mini M4, two thirds of its memory.
MAC_16GB = {
    "resource_limit": 499000,
    "max_buffer_length": 8589934592,
    "architecture": "applegpu_g13g",
    "memory_size": 17179869184,
    "max_recommended_working_set_size": 11453251584,
    "device_name": "Apple M1",
}
# A 128 GB Apple M5 Max on stock settings (mlx 0.32.2): 107.52 GiB, the figure antirez/ds4#893 gives
# for two 128 GB Macs of different generations.
MAC_128GB = {
    "device_name": "Apple M5 Max",
    "max_recommended_working_set_size": 115448725504,
    "memory_size": 137438953472,
    "architecture": "applegpu_g17s",
    "max_buffer_length": 86586540032,
    "resource_limit": 499000,
}
# This Linux machine's CPU device (mlx 0.32.4): no working set.
LINUX_CPU = {"architecture": "x86_64", "device_name": "AMD EPYC"}


def mac(host: str, info: dict, available: float, tflops: float = 4.0) -> Capabilities:
    """A probed Mac as local_capabilities builds it: usable is free memory
    within the working set."""
    limit = working_set(info)
    return Capabilities(
        host,
        info["memory_size"] / GIB,
        usable_bytes(available, limit) / GIB,
        tflops,
        120,
        info["device_name"],
        working_set_gb=limit / GIB,
    )


# --- memory -------------------------------------------------------------------------------------


def test_a_macs_usable_memory_is_free_memory_within_its_recommended_working_set():
    assert working_set(MAC_16GB) == 11453251584 and working_set(LINUX_CPU) == 0
    assert usable_bytes(14e9, working_set(MAC_16GB)) == 11453251584  # the GPU may wire no more
    assert usable_bytes(6e9, working_set(MAC_16GB)) == 6e9  # other apps hold the rest now
    assert usable_bytes(6e9, working_set(LINUX_CPU)) == 6e9
    # the planner's default for a declared Mac matches what Metal recommends on 16 GB
    assert default_usable_gb(16) == pytest.approx(working_set(MAC_16GB) / GIB, rel=1e-5)
    assert default_usable_gb(128) <= working_set(MAC_128GB) / GIB  # errs small on newer Macs


def test_a_declared_usable_gb_cannot_lift_a_probed_mac_past_metals_limit():
    mini = mac("mini", MAC_16GB, 14e9)
    assert with_host_keys(mini, {"usable_gb": 14}).usable_gb == pytest.approx(10.667, abs=1e-3)
    assert with_host_keys(mini, {"max_memory_gb": 8}).usable_gb == 8
    linux = Capabilities("box", 64, 48, 1, 50)
    assert with_host_keys(linux, {"usable_gb": 60}).usable_gb == 60


def test_the_suggested_wired_limit_covers_the_need_and_leaves_macos_its_share():
    assert wired_limit_mb(11.1 * GIB, 16 * GIB) == 12288  # rounded up to a whole GiB
    assert wired_limit_mb(12 * GIB, 16 * GIB) == 12288
    assert wired_limit_mb(12.5 * GIB, 16 * GIB) is None  # would leave macOS under 4 GiB
    assert wired_limit_mb(110 * GIB, MAC_128GB["memory_size"]) == 110 * 1024


# A Qwen2.5-32B-like model, 4-bit: 64 layers of about 0.3 GiB (0.5e9 parameters each); its runtime
# on a Mac (one layer's arrays for a 512-token chunk) 0.5 GiB.
RUNTIME = {"act_bytes_per_token": 2**20}
Q32B = ModelSpec(
    64,
    0.3 * GIB,
    1.0 * GIB,
    0.25e9,
    4096,
    0.3 * GIB,
    1.0e9,
    1.0e9,
    "bfloat16 q4",
    "32b-4bit",
    **RUNTIME,
)


def test_a_slice_beyond_a_macs_working_set_is_refused_naming_the_host_and_the_sysctl():
    caps = [mac("studio", MAC_128GB, 120e9, 30), mac("mini", MAC_16GB, 14e9)]
    with pytest.raises(ValueError) as e:
        plan_layers(Q32B, caps, "uniform", 8192)  # half the layers on the mini: 11.1 GB
    said = str(e.value)
    assert said.startswith("host mini (rank 1) cannot hold its slice: layers [32, 64) need 11.1 GB")
    assert "Metal lets its GPU wire at most 10.7 GB there (the recommended working set)" in said
    assert "`sudo sysctl iogpu.wired_limit_mb=12288`" in said and "add a host" in said
    assert "smaller or more quantized model" in said
    # the planner itself keeps within it
    assert plan_layers(Q32B, caps, "balanced", 8192).sizes[1] < 32


def test_no_sysctl_is_suggested_where_raising_it_would_starve_macos():
    big = ModelSpec(64, 0.4 * GIB, 1.0 * GIB, 0.25e9, 16384, 0.4 * GIB, 1.0e9, 1.0e9, **RUNTIME)
    caps = [mac("studio", MAC_128GB, 120e9, 30), mac("mini", MAC_16GB, 14e9)]
    with pytest.raises(
        ValueError, match=r"host mini \(rank 1\) .* need 17.3 GB .*would leave macOS too little"
    ) as e:
        plan_layers(big, caps, "uniform", 8192)
    assert "sysctl" not in str(e.value)


def test_a_ring_of_macs_too_small_is_told_which_sysctl_makes_room():
    minis = [mac("mini-1", MAC_16GB, 14e9), mac("mini-2", MAC_16GB, 14e9)]
    with pytest.raises(ValueError) as e:
        plan_layers(Q32B, minis, "balanced", 8192)  # 23.2 GB in all, 21.3 GB usable
    said = str(e.value)
    assert "mini-1 (rank 0) holds at most" in said and "its GPU may wire 10.7 of 16 GB" in said
    assert "Add a host, pick a smaller or more quantized model, or lower KV_TOKENS" in said
    assert (
        "`sudo sysctl iogpu.wired_limit_mb=12288` on mini-1, `sudo sysctl "
        "iogpu.wired_limit_mb=12288` on mini-2" in said
    )
    raised = [
        mac(c.host, MAC_16GB | {"max_recommended_working_set_size": 12 * GIB}, 14e9) for c in minis
    ]
    assert sum(plan_layers(Q32B, raised, "balanced", 8192).sizes) == 64  # as suggested, it fits
    huge = ModelSpec(64, 0.6 * GIB, 1.0 * GIB, 0.25e9, 4096, 0.6 * GIB, 1.0e9, 1.0e9, **RUNTIME)
    with pytest.raises(ValueError) as e:
        plan_layers(huge, minis, "balanced", 8192)
    assert "sysctl" not in str(e.value)  # no limit a Mac can spare would do


# --- the watchdog: which payloads are received apart ------------------------------------------


def test_receive_apart_setting():
    both, prefill = frozenset({"PREFILL", "DECODE"}), frozenset({"PREFILL"})
    assert [receive_apart_setting(v) for v in ("auto", "on", "1", "Prefill", "OFF", "0")] == [
        None,
        both,
        both,
        prefill,
        frozenset(),
        frozenset(),
    ]
    with pytest.raises(ValueError, match="RECEIVE_APART='sometimes' must be auto"):
        receive_apart_setting("sometimes")


def test_on_metal_prefill_and_decode_payloads_are_received_apart():
    metal = receives_apart(metal=True)
    assert not in_graph(Kind.PREFILL, lazy=True, apart=metal)
    assert not in_graph(Kind.DECODE, lazy=True, apart=metal)
    # read on the host anyway
    for kind in (Kind.JOIN, Kind.FILTER, Kind.STATUS, Kind.LOAD, Kind.SAVE, Kind.TRIM):
        assert not in_graph(kind, lazy=True, apart=metal)
    cpu = receives_apart(metal=False)
    assert in_graph(Kind.PREFILL, lazy=True, apart=cpu) and in_graph(
        Kind.DECODE, lazy=True, apart=cpu
    )
    assert not in_graph(Kind.DECODE, lazy=False, apart=cpu)  # a caller that did not ask
    # RECEIVE_APART=prefill goes back to decode payloads in the graph; on and off hold on any device
    back = receives_apart(metal=True, setting=receive_apart_setting("prefill"))
    assert not in_graph(Kind.PREFILL, lazy=True, apart=back) and in_graph(
        Kind.DECODE, lazy=True, apart=back
    )
    assert receives_apart(metal=False, setting=receive_apart_setting("on")) == {
        Kind.PREFILL,
        Kind.DECODE,
    }
    assert receives_apart(metal=True, setting=receive_apart_setting("off")) == frozenset()


def test_a_ring_here_receives_apart_only_when_told(monkeypatch):
    world = mx.distributed.init()
    monkeypatch.delenv("RECEIVE_APART", raising=False)
    ring = Ring(world)
    assert not ring.apart and ring.wait_in_kernel  # a CPU: no watchdog, waits in the kernel
    monkeypatch.setenv("RECEIVE_APART", "on")
    assert (
        Ring(world).apart == {Kind.PREFILL, Kind.DECODE}
        and not Ring(world, receive_apart=frozenset()).apart
    )
    assert parse_config([])[0].receive_apart == {"PREFILL", "DECODE"}
    monkeypatch.setenv("RECEIVE_APART", "prefill")
    assert Ring(world).apart == {Kind.PREFILL}
    monkeypatch.setenv("RECEIVE_APART", "maybe")
    with pytest.raises(ValueError, match="RECEIVE_APART"):
        parse_config([])


# --- the watchdog: prompt tokens per prefill step ---------------------------------------------


def test_a_16gb_mac_mini_holding_half_a_32b_model_gets_chunks_well_under_the_watchdog():
    flops = 32 * Q32B.layer_flops  # its 32 layers' FLOPs per token
    # an M4's ~3.5 TFLOP/s, at the share prefill reaches
    per_token = flops / (3.5e12 * PREFILL_SHARE)
    assert 512 * per_token > WATCHDOG_S  # the old GPU default: one chunk past the watchdog
    chunk = watchdog_chunk([("mini", flops, 3.5)], cap=512)
    assert chunk % 16 == 0 and 16 <= chunk < 512
    assert chunk * per_token <= STAGE_BUDGET_S < (chunk + 16) * per_token


def test_chunks_are_capped_shared_per_machine_and_never_empty():
    assert watchdog_chunk([("studio", 16 * 1e9, 30.0)], cap=512) == 512  # a fast Mac keeps the cap
    one = watchdog_chunk([("mini", 16e9, 3.5)], cap=512)
    # two ranks share one GPU
    two = watchdog_chunk([("mini", 8e9, 3.5), ("mini", 8e9, 3.5)], cap=512)
    assert two == one
    assert watchdog_chunk([("mini", 8e9, 3.5), ("other", 8e9, 3.5)], cap=512) > one  # two GPUs
    # a token past the budget: one at a time
    assert watchdog_chunk([("slow", 1e12, 1.0)], cap=512) == 1
    assert watchdog_chunk([], cap=128) == 128


def test_the_server_sizes_chunks_from_the_macs_in_the_ring_unless_prefill_chunk_is_set(monkeypatch):
    monkeypatch.delenv("PREFILL_CHUNK", raising=False)
    cfg = parse_config([])[0]
    linux = RankFacts(0, "box", (0, 32), planned=Planned(tflops=0.15, working_set_gb=0.0))
    mini = RankFacts(1, "mini", (32, 64), planned=Planned(tflops=3.5, working_set_gb=10.67))
    # this CPU's default
    assert startup.prefill_chunk(cfg, Cluster((linux,)), Q32B.layer_flops) == 128
    want = watchdog_chunk([("mini", 32 * Q32B.layer_flops, 3.5)], cap=128)
    assert startup.prefill_chunk(cfg, Cluster((linux, mini)), Q32B.layer_flops) == want < 128
    assert (
        startup.prefill_chunk(
            parse_config(["--prefill-chunk", "300"])[0], Cluster((linux, mini)), Q32B.layer_flops
        )
        == 300
    )
    # in tensor mode each rank computes its share of every layer
    pair = (replace(mini, rank=0, layers=(0, 64)), replace(mini, host="mini2", layers=(0, 64)))
    want = watchdog_chunk(
        [("mini", 32 * Q32B.layer_flops, 3.5), ("mini2", 32 * Q32B.layer_flops, 3.5)], cap=128
    )
    assert startup.prefill_chunk(cfg, Cluster(pair, PlanFacts(tensor=2)), Q32B.layer_flops) == want


def test_only_a_gpu_with_memory_of_its_own_moves_pages_when_the_host_reads_an_array():
    # the prompt cache's disk copy follows it (cache/held.py): a Mac's unified memory moves nothing
    cuda = {"device_name": "NVIDIA H200", "total_memory": 150_110_011_392, "free_memory": 149 << 30}
    assert host_reads_move_pages(cuda)
    assert not any(map(host_reads_move_pages, (MAC_16GB, MAC_128GB, LINUX_CPU)))
