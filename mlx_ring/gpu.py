"""The GPU a rank runs on: one GPU per rank on a multi-GPU host, and on Apple Silicon the memory
Metal lets a rank wire, the command-buffer watchdog, and Metal's command-buffer errors named for
the user, as MLX and mlx-lm meet them; and a GPU that failed a step (Metal's or CUDA's), which
ends the rank.

The decisions are pure functions of plain values (MLX's `device_info()` dict, measured speeds), so
they are tested on recorded Macs from Linux. This module imports no MLX at the top: servers call
`one_gpu_per_rank` before MLX starts, and only the functions that ask the device import it.
"""

import logging
import math
import os
import re
from typing import NoReturn

from mlx_ring import exits, settings

log = logging.getLogger(__name__)
GIB = 2**30


def one_gpu_per_rank() -> None:
    """With CUDA_PER_RANK=1, rank r sees only GPU r (MLX picks its device when it starts). Call
    before the first `import mlx`."""
    if settings.text("CUDA_PER_RANK") == "1":
        os.environ["CUDA_VISIBLE_DEVICES"] = settings.text("MLX_RANK") or "0"


# --- Apple Silicon's memory -------------------------------------------------------------------

# A suggested `iogpu.wired_limit_mb` leaves macOS at least this much of the machine (mlx-lm's README
# asks only for "smaller than the memory size of the machine"; a 16 GB Mac idles at several GB).
MACOS_RESERVE_GIB = 4


def working_set(info: dict) -> int:
    """Metal's recommended working set in bytes, as MLX's `device_info()` reports it
    (`max_recommended_working_set_size`: what the GPU may wire, `iogpu.wired_limit_mb` when set);
    0 on devices that report none (CPU, CUDA)."""
    return int(info.get("max_recommended_working_set_size") or 0)


def usable_bytes(available: float, limit: float) -> float:
    """What a rank may fill: the memory free now, and on Metal no more than `limit`, the recommended
    working set (`working_set(info)`; 0: no such limit)."""
    return min(available, limit) if limit else available


def most_wired_mb(memory_bytes: float) -> int:
    """The highest `iogpu.wired_limit_mb` worth suggesting on a Mac of `memory_bytes`."""
    return (int(memory_bytes / GIB) - MACOS_RESERVE_GIB) * 1024


def wired_limit_mb(need_bytes: float, memory_bytes: float) -> int | None:
    """The `iogpu.wired_limit_mb` value that lets the GPU wire `need_bytes` (rounded up to a whole
    GiB), or None where that would leave macOS less than MACOS_RESERVE_GIB of `memory_bytes`."""
    mb = math.ceil(need_bytes / GIB - 1e-9) * 1024
    return mb if mb <= most_wired_mb(memory_bytes) else None


def on_metal() -> bool:
    """True where MLX computes on an Apple GPU (mlx-lm's own test)."""
    from mlx_lm.utils import can_run_metal

    return can_run_metal()


# A GPU with memory of its own (CUDA) is filled to at most this share of it, as vLLM's default
# `gpu_memory_utilization` does: the rest is for the CUDA context, cuBLAS's workspaces and MLX's
# allocator beside what the plan counts.
GPU_MEMORY_SHARE = 0.9


def own_memory(info: dict) -> tuple[int, int] | None:
    """(total, free) bytes of a GPU with memory of its own, as MLX's `device_info()`
    reports it on CUDA (`total_memory`, `free_memory`); None where the device shares the
    host's memory (CPU, Metal)."""
    total, free = info.get("total_memory"), info.get("free_memory")
    return (int(total), int(free)) if total and free is not None else None


def host_reads_move_pages(info: dict) -> bool:
    """Whether the host reading an array moves its pages off the GPU, whose next use moves them
    back: on a GPU with memory of its own (MLX's CUDA memory is managed), not on Metal or a CPU,
    where both read the same memory."""
    return own_memory(info) is not None


def usable_own(total: int, free: int) -> int:
    """What a rank may fill on a GPU of its own: what is free now, at most
    `GPU_MEMORY_SHARE` of it."""
    return int(min(free, GPU_MEMORY_SHARE * total))


def wire_memory() -> None:
    """On Metal, set MLX's wired limit to the recommended working set as mlx-lm does before it
    generates (`maybe_set_recommended_wired_limit`), and log both: without it a slice close to the
    Mac's memory is paged instead of kept resident. Call once, before loading weights."""
    if not on_metal():
        return
    import mlx.core as mx
    from mlx_lm.utils import maybe_set_recommended_wired_limit

    info = mx.device_info()
    before = maybe_set_recommended_wired_limit()
    log.info(
        "%s: MLX's wired limit is now the recommended working set, %.1f GB of %.1f GB (was %.1f "
        "GB); `sudo sysctl iogpu.wired_limit_mb=N` raises it",
        info.get("device_name", "Metal"),
        working_set(info) / GIB,
        int(info.get("memory_size") or 0) / GIB,
        (before or 0) / GIB,
    )


# --- Apple Silicon's command-buffer watchdog --------------------------------------------------

# The forward steps whose payloads a rank receives apart, by RECEIVE_APART's value (auto: None,
# every forward step on Metal and none elsewhere; `prefill` keeps decode payloads in the graph).
APART_STEPS = frozenset({"PREFILL", "DECODE"})
RECEIVE_APART = {
    "auto": None,
    "on": APART_STEPS,
    "1": APART_STEPS,
    "prefill": frozenset({"PREFILL"}),
    "off": frozenset(),
    "0": frozenset(),
}


def receive_apart_setting(value: str | None = None) -> frozenset[str] | None:
    """RECEIVE_APART (`value`, else the environment): the step kinds (names) whose payloads are
    received apart: on (prefill and decode), prefill, off, or auto (None: every forward step
    where Metal runs)."""
    value = settings.text("RECEIVE_APART") if value is None else value
    if value.lower() not in RECEIVE_APART:
        raise ValueError(
            f"RECEIVE_APART={value!r} must be auto (prefill and decode apart where Metal runs), "
            "on, prefill (decode payloads stay in the graph) or off"
        )
    return RECEIVE_APART[value.lower()]


# Metal aborts a command buffer that runs, or waits, for longer than about 5 s
# (kIOGPUCommandBufferCallbackErrorTimeout; ml-explore/mlx#1849, #3830). One stage's prefill chunk
# is sized to take at most STAGE_BUDGET_S, a fifth of that: MLX commits a stage in several command
# buffers, so each one takes less still, and the margin covers the probe's optimism (a square matmul
# runs faster than quantized layers with attention over a long context, PREFILL_SHARE) and a GPU the
# desktop uses too. (Waits on other ranks no longer count: on Metal they happen on the host.) macOS
# 26 also stops sustained GPU work on a Mac whose display is in use, short command buffers too
# (kIOGPUCommandBufferCallbackErrorImpactingInteractivity, ml-explore/mlx#3267): no chunk size is
# sure to avoid it there, so a rank that dies of it is named with that cause (`metal_failure`).
WATCHDOG_S = 5.0
STAGE_BUDGET_S = 1.0
PREFILL_SHARE = 0.5  # prefill runs at no less than this share of the probe's measured TFLOP/s


def watchdog_chunk(stages: list[tuple[str, float, float]], cap: int) -> int:
    """Prompt tokens per prefill step (at most `cap`) such that the busiest machine computes its
    stages of one step within STAGE_BUDGET_S. `stages`: per rank, (host, FLOPs its layers do per
    token, its measured TFLOP/s); ranks on one host share its GPU, so their times add up."""
    busy: dict[str, float] = {}
    for host, flops, tflops in stages:
        busy[host] = busy.get(host, 0.0) + flops / (max(tflops, 1e-6) * 1e12 * PREFILL_SHARE)
    per_token = max(busy.values(), default=0.0)
    if per_token <= 0:
        return cap
    n = int(STAGE_BUDGET_S / per_token)
    return max(1, min(cap, n // 16 * 16 if n >= 16 else n))  # multiples of 16: friendly shapes


# --- Metal's command-buffer errors ------------------------------------------------------------

# MLX raises a failed command buffer's error as "[METAL] Command buffer execution failed: <what>
# (<code>:kIOGPUCommandBufferCallbackError<Name>)." Before MLX 0.32.1 a rank aborted with it
# ("libc++abi: terminating due to uncaught exception ..."; ml-explore/mlx#479, #3224); since, MLX
# keeps it and raises it once, at a later eval or read, and the rank ends itself (`end_rank`).
# Each name's cause, and what to do.
METAL_ERRORS = {
    "ImpactingInteractivity": (
        "macOS stopped GPU work that kept the GPU from the display too long (Impacting "
        "Interactivity: macOS 26 stops sustained GPU work on a Mac whose display is in use, apart "
        "from the 5 s watchdog; ml-explore/mlx#3267)",
        "start the ring on a headless Mac (ssh to it, put it first in its hosts.json: rank 0 runs "
        "on the first host) and leave Macs whose display is in use out of the ring, or let their "
        "displays sleep while it works; lowering PREFILL_CHUNK (logged at startup) may help",
    ),
    "Timeout": (
        "a GPU command buffer ran, or waited, longer than the GPU watchdog allows (about 5 s)",
        "lower PREFILL_CHUNK (the chunk size is logged at startup), and keep RECEIVE_APART at auto",
    ),
    "OutOfMemory": (
        "the GPU ran out of memory (Insufficient Memory)",
        "lower KV_TOKENS or MAX_ACTIVE, add a host, or raise the Mac's GPU limit with "
        "`sudo sysctl iogpu.wired_limit_mb=N`; quit other apps that use the GPU",
    ),
    "Hang": (
        "the GPU hung (GPU Hang Error)",
        "the ring restarts; if it happens again, update macOS and report it with the rank logs",
    ),
    "PageFault": (
        "a GPU kernel read memory outside its buffers (GPU Address Fault)",
        "report it with the model and the rank logs: it is a fault of MLX or this "
        "project, not of the Mac",
    ),
    "SubmissionsIgnored": (
        "macOS ignored this process's GPU work after earlier GPU errors",
        "the first GPU error in the rank's log is the cause; the ring restarts",
    ),
    "InnocentVictim": (
        "macOS discarded this process's GPU work while it recovered from "
        "another program's GPU error",
        "the ring restarts; see which other program uses the GPU",
    ),
}
METAL_NAME = re.compile(r"kIOGPUCommandBufferCallbackError(\w+)")
# the name cut off, or none
METAL_FAILED = re.compile(r"\[METAL\] Command buffer execution failed: ([^(]+)")
FOLLOW_ON = ("SubmissionsIgnored", "InnocentVictim")  # they follow an error that is the cause
# Metal's descriptions of them, for a message whose name was cut off ("...
# failed: Insufficient Memory").
DESCRIBED = {
    "Impacting Interactivity": "ImpactingInteractivity",
    "Caused GPU Timeout Error": "Timeout",
    "Insufficient Memory": "OutOfMemory",
    "Caused GPU Hang Error": "Hang",
    "Caused GPU Address Fault Error": "PageFault",
}


def metal_failure(output: str) -> str | None:
    """Metal's command-buffer error in a rank's `output`, named with its cause and what to do; None
    where there is none. The first error that is not a consequence of another is the cause."""
    named = metal_named(output)
    return None if named is None else f"a GPU command buffer failed ({named[0]}): {named[1]}"


def metal_named(output: str) -> tuple[str, str] | None:
    """`metal_failure`'s parts: the error's name (its code), and its cause and what to do."""
    names = [
        DESCRIBED.get(m.group(1).strip(), m.group(1).strip())
        for line in output.splitlines()
        if (m := METAL_NAME.search(line) or METAL_FAILED.search(line))
    ]
    if not names:
        return None
    name = next((n for n in names if n not in FOLLOW_ON), names[0])
    cause, fix = METAL_ERRORS.get(
        name, (f"Metal reported {name!r}", "see the rank's log; the ring restarts")
    )
    code = f"kIOGPUCommandBufferCallbackError{name}" if name in METAL_ERRORS else name
    return code, f"{cause}; {fix}"


# --- A GPU that failed a step ------------------------------------------------------------------

# CUDA's sticky errors, as MLX raises them ("<call> failed: <cudaGetErrorString>"): the context is
# lost, and every later call fails too. Out of memory and the like are not among them.
CUDA_FAULTS = (
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "misaligned address",
    "operation not supported on global/shared address space",
    "invalid program counter",
    "hardware stack error",
    "unspecified launch failure",
    "the launch timed out and was terminated",
    "device-side assert triggered",
    "uncorrectable ECC error encountered",
)
DEVICE_FAILED = re.compile(
    r"\[METAL\] Command buffer execution failed: [^\n]*"
    r"|[^\n]* failed: (?:" + "|".join(map(re.escape, CUDA_FAULTS)) + ")"
)


def device_failure(e: BaseException) -> str | None:
    """MLX's words for the GPU failing a step, in `e` or an error it was raised from (a ring step
    wraps it), else None. What that step wrote (KV caches too) cannot be trusted, and MLX raises
    it once only: a caller that went on would compute on garbage."""
    found, seen = None, set()
    while e is not None and id(e) not in seen:  # the innermost is MLX's own, unwrapped
        seen.add(id(e))
        if m := DEVICE_FAILED.search(str(e)):
            found = m.group(0)
        e = e.__cause__ or e.__context__
    return found


def is_device_failure(e: BaseException) -> bool:
    """Whether `e` is the GPU failing a step (`device_failure`): it ends the rank, never one row."""
    return device_failure(e) is not None


def end_rank(e: BaseException, rank: int | None = None) -> NoReturn:
    """End this rank whose GPU failed a step (`e`), with the line the launcher names it by
    (`exits.gpu_failure`) and exit code DEVICE_FAILED. Never retried in the process."""
    rank = int(settings.text("MLX_RANK") or 0) if rank is None else rank
    log.error("%s", exits.gpu_failure(rank, device_failure(e) or str(e)))
    logging.shutdown()
    os._exit(exits.DEVICE_FAILED)
