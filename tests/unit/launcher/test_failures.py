"""launcher/failures.py: the causes a failed ring's output names, on recorded Metal errors
(tests/data/macos/README.md names their sources) and MLX's ring connect failures; and the GPU
failures a rank ends on (gpu.device_failure), as MLX raises them and as the launcher names them."""

from pathlib import Path

import pytest

from mlx_ring import exits
from mlx_ring.gpu import device_failure, is_device_failure, metal_failure
from mlx_ring.launcher.failures import explain, gpu_failed, ring_connect_failure
from mlx_ring.ring.handle import RingError
from mlx_ring.tensor.lockstep import RankLeft

MAC = Path(__file__).resolve().parents[2] / "data" / "macos"

# Captured on this Linux machine with MLX 0.32.4: rank 1 of a ring of two whose rank 0 never
# listened (`MLX_RANK=1 MLX_HOSTFILE=... python -c "from mlx_ring.ring.world import
# init_world; init_world()"`).
REFUSED_HERE = """Traceback (most recent call last):
  File "/work/wt/ringmac/mlx_ring/ring/transport.py", line 41, in init_world
    world = mx.distributed.init(backend="ring")
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: [ring] Couldn't connect (error: 111)

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<string>", line 3, in <module>
  File "/work/wt/ringmac/mlx_ring/ring/transport.py", line 48, in init_world
    raise RuntimeError(f"rank {rank} could not join the ring (its next rank, {after}, at "
RuntimeError: rank 1 could not join the ring (its next rank, 0, at 127.0.0.1:39990): [ring] Couldn't connect (error: 111)
"""


def rec(name: str) -> str:
    return (MAC / name).read_text()


def test_impacting_interactivity_names_the_mac_with_a_display_and_the_fix():
    said = metal_failure("[launcher] ...\n" + rec("metal_impacting_interactivity.txt"))
    assert said.startswith(
        "a GPU command buffer failed (kIOGPUCommandBufferCallbackErrorImpactingInteractivity)"
    )
    assert (
        "display is in use" in said
        and "start the ring on a headless Mac" in said
        and "PREFILL_CHUNK" in said
    )


def test_the_watchdog_timeout_is_told_apart_from_interactivity():
    said = metal_failure(rec("metal_timeout.txt"))
    assert "(kIOGPUCommandBufferCallbackErrorTimeout)" in said and "about 5 s" in said
    assert "lower PREFILL_CHUNK" in said and "display" not in said


def test_out_of_memory_and_a_follow_on_error_name_the_first_cause():
    said = metal_failure(rec("metal_out_of_memory.txt"))
    assert "ran out of memory" in said and "iogpu.wired_limit_mb" in said
    # Metal ignores later work after an error: the error before it is the cause
    both = rec("metal_submissions_ignored.txt") * 3 + rec("metal_timeout.txt")
    assert "(kIOGPUCommandBufferCallbackErrorTimeout)" in metal_failure(both)
    assert "earlier GPU errors" in metal_failure(rec("metal_submissions_ignored.txt"))


def test_a_message_cut_before_its_name_is_known_by_its_description():
    # jjang-ai/vmlx issue #58 (vMLX's log of MLX's abort, 2026-04-09), complete as
    # the issue shows it
    said = metal_failure(
        "[error] libc++abi: terminating due to uncaught exception of type std::runtime_error: "
        "[METAL] Command buffer execution failed: Insufficient Memory\n"
    )
    assert "(kIOGPUCommandBufferCallbackErrorOutOfMemory)" in said and "ran out of memory" in said


def test_an_unknown_metal_error_is_still_named_and_no_error_is_none():
    assert "'Something New'" in metal_failure(
        "[METAL] Command buffer execution failed: Something New\n"
    )
    assert metal_failure(REFUSED_HERE) is None and metal_failure("") is None


def test_a_refused_ring_connect_names_the_rank_the_address_and_the_fix():
    said = ring_connect_failure(REFUSED_HERE)
    assert said.startswith(
        "rank 1 could not connect to rank 0 at 127.0.0.1:39990 (connection refused; "
        "MLX: [ring] Couldn't connect (error: 111))"
    )
    assert "its log says why" in said and "Local Network" not in said


def test_no_route_on_a_mac_gets_the_local_network_hint_and_on_linux_not():
    # MLX's wording (mlx/distributed/utils.cpp: `tag << " " << action << " (error: " <<
    # errno << ")"`), with macOS's EHOSTUNREACH (65), which Local Network privacy gives;
    # Linux numbers it 113.
    mac = ring_connect_failure("RuntimeError: [ring] Couldn't connect (error: 65)\n")
    assert mac.startswith("a rank could not connect to the next rank (no route to host;")
    assert "Local Network privacy" in mac and "keep Terminal running" in mac
    linux = ring_connect_failure("RuntimeError: [ring] Couldn't connect (error: 113)\n")
    assert "no route to host" in linux and "Local Network" not in linux
    # MLX after 0.32
    newer = ring_connect_failure("[ring] Couldn't connect to any resolved address (last error: 60)")
    assert "(timed out;" in newer and "firewall" in newer


def test_explain_lists_every_cause_the_output_names():
    assert explain("Node with rank 1 exited with code 1\n") == []
    causes = explain(REFUSED_HERE + rec("metal_timeout.txt"))
    assert (
        len(causes) == 2
        and "GPU command buffer" in causes[0]
        and "rank 1 could not connect" in causes[1]
    )


# What MLX raises since 0.32.1, at an eval or read after the failed command buffer
# (mlx/backend/metal/device.cpp: "[METAL] Command buffer execution failed: {}.", with Metal's
# localizedDescription), and on CUDA (mlx/backend/cuda/utils.cpp's check_cuda_error: "{call}
# failed: {cudaGetErrorString}", the string as an H200's driver gives it for error 700).
METAL_TIMEOUT = (
    "[METAL] Command buffer execution failed: Caused GPU Timeout Error "
    "(00000002:kIOGPUCommandBufferCallbackErrorTimeout)."
)
CUDA_ILLEGAL = "cudaStreamSynchronize(stream_) failed: an illegal memory access was encountered"


@pytest.mark.parametrize("said", [METAL_TIMEOUT, CUDA_ILLEGAL])
def test_a_gpu_failure_is_known_in_mlxs_words_and_through_the_ring_errors_that_wrap_it(said):
    assert device_failure(RuntimeError(said)) == said
    # as ring/pipeline.py and ring/lockstep.py re-raise what an eval inside a ring step raised
    for wrap in (RingError, RankLeft):
        try:
            try:
                raise RuntimeError(said)
            except RuntimeError as e:
                raise wrap(f"ring step DECODE failed: {e}") from e
        except wrap as outer:
            assert is_device_failure(outer) and device_failure(outer) == said


@pytest.mark.parametrize(
    "said",
    [
        "[malloc] Unable to allocate 68719476736 bytes.",  # MLX refuses the graph: nothing ran
        "cudaMallocAsync(&data, size, stream) failed: out of memory",  # not sticky
        "[ring] Couldn't connect (error: 111)",
        "logit_bias names token ids outside the vocabulary [0, 49152)",
        "`min_p` has to be a float in the [0, 1] interval, but is 1.5",
    ],
)
def test_other_errors_are_no_gpu_failure(said):
    assert not is_device_failure(RuntimeError(said)) and not is_device_failure(ValueError(said))


def test_a_ranks_gpu_failure_line_is_named_with_its_host_cause_and_fix():
    out = "\n".join(
        [
            "2026-01-01 10:00:00 [rank 1 mini-b] ERROR mlx_ring.gpu: "
            + exits.gpu_failure(1, METAL_TIMEOUT),
            "2026-01-01 10:00:00 [rank 2 gpu-c] ERROR mlx_ring.gpu: "
            + exits.gpu_failure(2, CUDA_ILLEGAL),
            "Node with rank 1 exited with code 71",
        ]
    )
    assert exits.gpu_failures(out) == {1: METAL_TIMEOUT, 2: CUDA_ILLEGAL}
    metal, cuda = gpu_failed(out, ["127.0.0.1", "mini-b", "gpu-c"])
    assert metal.startswith(
        "rank 1 on mini-b: the GPU failed a command buffer "
        "(kIOGPUCommandBufferCallbackErrorTimeout): a GPU command buffer ran, or waited, longer"
    )
    assert "lower PREFILL_CHUNK" in metal
    assert cuda.startswith(f"rank 2 on gpu-c: the GPU failed a kernel ({CUDA_ILLEGAL}): ")
    # named once: not again as an anonymous Metal error
    assert explain(out, ["127.0.0.1", "mini-b", "gpu-c"]) == [metal, cuda]
