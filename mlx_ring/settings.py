"""Every setting in one table: its name, default, parser and meaning. The ranks' `Config`
(config.py), the launcher's settings (launcher/launch_settings.py) and every other read of the
environment draw on it, so a setting has one default and is read one way. It imports nothing of the
package: every floor may use it.
"""

import os
from dataclasses import dataclass
from typing import Callable, Mapping

# Who reads a setting. FLAG: a flag of server.py (--max-queue for MAX_QUEUE) whose default is
# the variable; RANK: the ranks read it from the environment only (secrets kept off command
# lines, and what only tests and multi-GPU hosts set); the launcher forwards both kinds to every
# rank. LAUNCHER: read by the launcher alone. RUN: the launcher sets it for each rank of a run.
# MLX: MLX's own (mlx.launch).
FLAG, RANK, LAUNCHER, RUN, MLX = "flag", "rank", "launcher", "run", "mlx"


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None  # as it would be written in .env; None: unset
    scope: str
    help: str = ""
    parse: Callable[[str], object] = str
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.lower().replace("_", "-")


def _s(name, default, scope, help="", parse=str, choices=()):
    return Setting(name, default, scope, help, parse, choices)


_TABLE = (
    _s(
        "MODEL", None, FLAG, "MLX folder, .gguf file or HF repo id (default: SmolLM2-135M-Instruct)"
    ),
    _s(
        "SERVED_MODEL_NAME",
        None,
        FLAG,
        "the model's name in the API (default: MODEL's folder or file name, a repo id as given)",
    ),
    _s(
        "MODEL_ALIASES",
        "",
        FLAG,
        (
            "comma-separated other names or patterns requests may use for the model, "
            "e.g. 'claude-*,gpt-*'"
        ),
    ),
    _s(
        "WEIGHTS",
        "auto",
        FLAG,
        "auto: float32 on a CPU device (MLX's CPU quantized kernels are slow), as stored elsewhere",
        choices=("auto", "float32", "keep"),
    ),
    _s("HOST", "127.0.0.1", FLAG, "HTTP bind address (rank 0)"),
    _s("PORT", "8100", FLAG, "HTTP port (rank 0)", int),
    _s("CACHE_DIR", "~/.cache/mlx-ring", FLAG, "converted models and probe results"),
    _s(
        "LOG_DIR",
        "logs",
        FLAG,
        "logs and the run's shared files, relative to the checkout unless absolute",
    ),
    _s("LAYERS", None, FLAG, "per-rank layer counts, e.g. 3,2,2 (default: even split)"),
    _s("MAX_QUEUE", "64", FLAG, "requests waiting beyond MAX_ACTIVE; more get 503", int),
    _s("MAX_ACTIVE", "16", FLAG, "sequences generating at once", int),
    _s("MAX_TOKENS", "512", FLAG, "default completion limit", int),
    _s(
        "MAX_TOKENS_LIMIT",
        "0",
        FLAG,
        "most completion tokens one request may ask for (0: the model's context length)",
        int,
    ),
    _s("LOG_LEVEL", "INFO", FLAG),
    _s(
        "STEP_TIMEOUT",
        "60",
        FLAG,
        "seconds one trip round the ring may take before the ring counts as broken",
        float,
    ),
    _s("DRAIN_TIMEOUT", "30", FLAG, "seconds running requests get to finish after SIGTERM", float),
    _s(
        "GROUPS",
        "auto",
        FLAG,
        (
            "decode micro-batches kept in flight (auto: one per rank, so every rank has a group to "
            "work on; one in tensor mode)"
        ),
    ),
    _s(
        "PREFILL_CHUNK",
        "auto",
        FLAG,
        "prompt tokens per prefill step (auto: 512 on a GPU, 128 on a CPU); chunks of one prompt "
        "overlap across ranks",
    ),
    _s(
        "STRATEGY",
        "balanced",
        FLAG,
        "how layers are split: balanced (default: fastest plan that fits), uniform, memory, "
        "compute, custom (hosts.json)",
        choices=("balanced", "uniform", "memory", "compute", "custom"),
    ),
    _s(
        "PARALLEL",
        "auto",
        FLAG,
        "how the ranks split the model: pipeline (each rank a range of layers), tensor (each rank "
        "a share of every layer), or auto (the one predicted faster from the ring's measured "
        "all_sum, each rank's speed and memory)",
        choices=("auto", "pipeline", "tensor"),
    ),
    _s(
        "KV_TOKENS",
        "8192",
        FLAG,
        "tokens of KV cache every rank keeps room for when the layer plan is made",
        int,
    ),
    _s(
        "PROMPT_CACHE_GB",
        "auto",
        FLAG,
        "GB of RAM each rank keeps for the KV caches of recent prompts, reused by later prompts "
        "that start alike (auto: half of what the layer plan leaves the rank; a number caps it; "
        "0: off)",
    ),
    _s(
        "PROMPT_DISK_GB",
        "auto",
        FLAG,
        "GB of each rank's own disk for the prompt cache's blocks, which outlive restarts (auto: "
        "a quarter of the free space above the floor, at most 100; 0: off)",
    ),
    _s(
        "PROMPT_DISK_FLOOR_GB",
        "auto",
        FLAG,
        "free GB below which a rank's disk tier stops writing (auto: 20, or a tenth of the disk "
        "if more: snapshots may keep deleted blocks a while)",
    ),
    _s(
        "PROMPT_CACHE_DIR",
        "auto",
        FLAG,
        "the folder of each rank's prompt-cache blocks (auto: ~/Library/Caches/"
        "mlx-ring.noindex/prompt-blocks on macOS, CACHE_DIR/prompt-blocks elsewhere)",
    ),
    _s(
        "PROMPT_CACHE_BLOCK",
        "256",
        FLAG,
        "tokens of a prompt-cache block: prompts share cached KV by whole blocks, and the start "
        "of one more",
        int,
    ),
    _s(
        "KV_BITS",
        "0",
        FLAG,
        "8 or 4: every rank keeps its prompt-cache blocks quantized to this many bits a value, "
        "in RAM and on disk: the same GB hold about 1.9 or 3.6 times the tokens of 16-bit KV "
        "(0: off)",
        int,
    ),
    _s(
        "DRAFT_TOKENS",
        "0",
        FLAG,
        "speculative decoding: up to this many tokens a step guessed from the prompt and output so "
        "far (prompt lookup) and verified in one pass; helps when answers repeat "
        "their input (0: off)",
        int,
    ),
    _s(
        "DRAFT_MODEL",
        None,
        FLAG,
        "draft with this smaller model of the same tokenizer on rank 0 instead of prompt lookup",
    ),
    _s(
        "HOSTFILE",
        "hosts.json",
        FLAG,
        "hosts.json: the ring in order, rank 0 first, and its per-host planning keys",
    ),
    _s(
        "RING_SOCKET_BUFFER",
        "0",
        FLAG,
        "kernel send/receive buffer of each ring socket in bytes (0: the system's); small "
        "ones model a slow link's",
        int,
    ),
    _s(
        "RING_VERBOSE",
        "0",
        FLAG,
        "1: MLX's ring backend logs each rank's connection attempts as the ring starts "
        "(MLX_RING_VERBOSE), into logs/attempt.log; for a start that hangs",
        choices=("0", "1"),
    ),
    _s(
        "MAX_BODY_BYTES",
        str(16 * 1024 * 1024),
        FLAG,
        "largest request body in bytes (default 16 MiB); larger ones get a 413",
        int,
    ),
    _s("API_KEY", None, RANK, "if set, /v1/* and /api/* need it as a bearer token or x-api-key"),
    _s(
        "API_KEYS_FILE",
        None,
        RANK,
        "a JSON list of named keys with per-minute limits (api/keys.py)",
    ),
    _s("TLS_CERT", None, RANK, "PEM certificate on rank 0's host: HTTPS (with TLS_KEY)"),
    _s("TLS_KEY", None, RANK, "PEM key on rank 0's host: HTTPS (with TLS_CERT)"),
    _s(
        "MLX_RING_CAPS",
        None,
        RANK,
        "a JSON list of per-rank capabilities that replace the probes' (tests, or to pretend)",
    ),
    _s("CUDA_PER_RANK", "0", RANK, "1: each local rank gets its own GPU", choices=("0", "1")),
    _s(
        "RING_FRAMES",
        "auto",
        RANK,
        "auto: steps cross the ring in fixed-size frames on JACCL (its sends of changing "
        "sizes are unsafe); on: on every transport (tests), or a frame size in bytes; off: never",
    ),
    _s(
        "RECEIVE_APART",
        "auto",
        RANK,
        "steps whose payloads a rank receives before it builds their stage: auto, on, prefill, off",
    ),
    _s(
        "RING_AWAY",
        None,
        RANK,
        "the hosts a failed-over ring serves without, as JSON (the launcher sets it)",
    ),
    _s(
        "RING_PORT",
        "32323",
        LAUNCHER,
        "first port of the ring's sockets, one per rank counting up",
        int,
    ),
    _s(
        "STARTUP_TIMEOUT",
        "600",
        LAUNCHER,
        "seconds ./launch.sh waits for the ring to answer",
        float,
    ),
    _s(
        "MAX_RESTARTS",
        "5",
        LAUNCHER,
        "ring restarts after failures before the launcher gives up",
        int,
    ),
    _s(
        "FAILOVER_AFTER",
        "0",
        LAUNCHER,
        "seconds a host may stay away before the ring serves without it (0: never)",
        float,
    ),
    _s("CUDA", "0", LAUNCHER, "1: the environment gets mlx[cuda13]"),
    _s(
        "PROVISION",
        "1",
        LAUNCHER,
        "0: hosts are only checked, never sent code, environment or weights",
    ),
    _s(
        "RING_SSH_CONFIG",
        None,
        LAUNCHER,
        "the ssh config the ring's ssh connections include (default: ~/.ssh/config)",
    ),
    _s("UV", None, LAUNCHER, "uv as launch.sh found it"),
    _s("RING_MODEL_ID", None, RUN, "load the slice sent to this host under this model id"),
    _s("RING_PLAN", None, RUN, "the plan the launcher provisioned, as strategy:n,n,..."),
    _s("RING_RESTARTS", "0", RUN, "times the launcher restarted the ring before this run", int),
    _s("MLX_RANK", None, MLX, "this rank's index"),
    _s(
        "MLX_HOSTFILE",
        None,
        MLX,
        "the ring's description: per rank, the ip:port addresses it listens on",
    ),
    _s(
        "MLX_IBV_DEVICES",
        None,
        MLX,
        "JACCL: a file of every rank's RDMA device to every other rank "
        "(mlx.launch --backend jaccl)",
    ),
    _s(
        "MLX_JACCL_COORDINATOR",
        None,
        MLX,
        "JACCL: rank 0's ip:port, where the ranks exchange their RDMA addresses",
    ),
    _s(
        "MLX_JACCL_RING",
        None,
        MLX,
        "JACCL: set for --backend jaccl-ring (only neighbours have a device)",
    ),
    _s(
        "NCCL_HOST_IP",
        None,
        MLX,
        (
            "NCCL: rank 0's address, where tensor mode's NCCL group forms (default: "
            "rank 0's ring address)"
        ),
    ),
    _s(
        "NCCL_PORT",
        None,
        MLX,
        "NCCL: the port it forms on (default: the one after the ring's highest port)",
    ),
    _s("CUDA_VISIBLE_DEVICES", None, MLX, "the GPUs this process sees (CUDA's own)"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _TABLE}


def names(*scopes: str) -> tuple[str, ...]:
    """The settings of these scopes, in the table's order."""
    return tuple(s.name for s in _TABLE if s.scope in scopes)


def given(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """A setting as this process's environment (or `env`) gives it, without its default: for what
    each host defaults by itself (CACHE_DIR, under its own home)."""
    assert name in SETTINGS, name
    return (os.environ if env is None else env).get(name) or None


def text(
    name: str, env: Mapping[str, str] | None = None, dot: Mapping[str, str | None] | None = None
) -> str | None:
    """A setting as written: in `env` (default: this process's environment), else in `dot` (a
    `.env`'s values), else its default; an empty value counts as unset."""
    env = os.environ if env is None else env
    return env.get(name) or (dot or {}).get(name) or SETTINGS[name].default


def read(
    name: str, env: Mapping[str, str] | None = None, dot: Mapping[str, str | None] | None = None
):
    """A setting parsed (None when unset and without a default); ValueError naming
    it and the fix."""
    s, value = SETTINGS[name], text(name, env, dot)
    if value is None:
        return None
    if s.choices and value not in s.choices:
        raise ValueError(
            (
                f"{name}={value!r} must be one of {', '.join(s.choices)}; fix it in "
                "the environment or .env"
            )
        )
    try:
        return s.parse(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} must be a number; fix it in the environment or .env"
        ) from None
