"""Settings: one frozen dataclass, built once in `main()` from flags, the environment and `.env`,
as the\nsettings table (mlx_ring/settings.py) names, defaults and parses them."""

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from dotenv import load_dotenv

from mlx_ring.gpu import receive_apart_setting
from mlx_ring.settings import FLAG, RANK, SETTINGS, given, names, read

ROOT = Path(__file__).resolve().parents[1]  # the checkout: hosts.json, .env, logs/
CACHE_DIR = Path(SETTINGS["CACHE_DIR"].default).expanduser()  # converted models, probe results


@dataclass(frozen=True, kw_only=True)
class Config:
    """The ranks' settings; their defaults and variables are the settings table's
    (mlx_ring/settings.py)."""

    model: str | None  # None: the default model
    weights: str  # auto | float32 | keep
    host: str
    port: int
    cache_dir: Path
    log_dir: Path
    layers: tuple[int, ...] | None  # explicit per-rank layer counts, else a uniform split
    max_queue: int
    max_active: int  # sequences generating at once; the rest wait in the queue
    default_max_tokens: int
    log_level: str
    step_timeout: float  # seconds a ring round trip may take before rank 0 declares the ring broken
    drain_timeout: float  # seconds running requests get to finish after SIGTERM
    api_key: str | None  # if set, /v1/* needs `Authorization: Bearer <key>`
    groups: int  # decode micro-batches in flight (0: one per rank)
    # prompt tokens per prefill step; 0: by device (serving/startup.prefill_chunk)
    prefill_chunk: int
    strategy: str  # layer plan: balanced | uniform | memory | compute | custom (strategies.py)
    # PARALLEL: auto | pipeline | tensor (planning/auto.py decides; plan.py's LayerPlan.tensor)
    parallel: str
    kv_tokens: int  # KV-cache tokens each rank reserves memory for when the layer plan is made
    # per rank: GB of RAM for KV caches of recent prompts kept for reuse, at most (None: auto,
    # as the layer plan leaves room: planning/promptcache.py; 0: no RAM tier)
    prompt_cache_gb: float | None
    # per rank: GB of its disk for prompt-cache blocks (None: by the free space; 0: off)
    prompt_disk_gb: float | None
    prompt_disk_floor_gb: float | None  # free GB below which it stops writing (None: by the disk)
    prompt_cache_dir: Path | None  # None: the system's folder (platform_disk.py)
    prompt_cache_block: int  # tokens a prompt-cache block holds
    kv_bits: int  # KV_BITS: bits a value of the prompt-cache blocks (0: unquantized)
    draft_tokens: int  # speculative decoding: most tokens drafted a step (0: off)
    # drafts from this model on rank 0 (MLX folder, .gguf or repo id), else by prompt lookup
    draft_model: str | None
    hostfile: Path  # rank 0 reads its per-host keys (max_memory_gb, layers, ...)
    max_tokens_limit: int  # most completion tokens a request may ask for; 0: the model's context
    # bytes of kernel buffer per ring socket; 0: the system's (tests shrink it)
    ring_socket_buffer: int
    ring_verbose: bool  # RING_VERBOSE=1: MLX's ring backend logs how each rank joins the ring
    model_id: str | None  # RING_MODEL_ID (set by the launcher): load the slice sent to this host
    # RING_PLAN (set by the launcher): the plan it provisioned
    plan: tuple[str, tuple[int, ...]] | None
    # RING_RESTARTS (set by the launcher): times it restarted the ring before this run
    restarts: int
    tls: tuple[Path, Path] | None  # TLS_CERT, TLS_KEY: rank 0 serves HTTPS with them
    api_keys_file: Path | None  # API_KEYS_FILE: keys with names and per-minute limits (api/keys.py)
    # RECEIVE_APART: steps whose payloads arrive before their stage (None: by device)
    receive_apart: frozenset[str] | None
    # RING_FRAMES: steps in fixed-size frames (auto: on JACCL), ring/frames.py
    ring_frames: str = "auto"
    max_body_bytes: int  # MAX_BODY_BYTES: larger request bodies get a 413
    # RING_AWAY (set by the launcher): the hosts a failed-over ring serves without
    away: dict | None
    # SERVED_MODEL_NAME: the model's name in the API (None: from MODEL, api/served.served_name)
    served_model_name: str | None
    # MODEL_ALIASES: other names, or shell-style patterns, requests may name it by
    model_aliases: tuple[str, ...]


# Settings read from the environment only, with no flag: secrets kept off command lines, and what
# only tests and multi-GPU hosts set. Every flag of `_parser` is a setting too, under its own name.
ENV_ONLY = names(RANK)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")  # refused by the bound that follows, with the setting's name


def json_objects(path: Path, what: str, example: str, known: tuple[str, ...]) -> list[dict]:
    """A settings file that is a non-empty JSON list of objects with only `known` keys (hosts.json,
    API_KEYS_FILE); ValueError naming the file, the entry and the fix."""
    return check_objects(read_json(path, what, example), path, what, example, known)


def read_json(path: Path, what: str, example: str):
    """A settings file's JSON; ValueError naming the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(
            f"cannot read {what} {path} ({e}); it must be a JSON list such as {example}"
        ) from None


def check_objects(rows, path: Path, what: str, example: str, known: tuple[str, ...]) -> list[dict]:
    """`rows` as json_objects checks them."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{what} {path} must be a non-empty JSON list of objects, e.g. {example}")
    for i, r in enumerate(rows):
        unknown = sorted(set(r) - set(known))
        if unknown:
            raise ValueError(
                (
                    f"{what} {path}: entry {i} has unknown key(s) {', '.join(unknown)}; the keys "
                    f"are {', '.join(known)}"
                )
            )
    return rows


def setting_names() -> tuple[str, ...]:
    """Every setting that shapes a rank: each flag's variable
    (--max-queue: MAX_QUEUE) and ENV_ONLY."""
    return (*names(FLAG), *ENV_ONLY)


def settings_to_forward() -> dict[str, str]:
    """The settings as this machine has them, which the launcher gives every rank; call after
    `parse_config`, which loads `.env` into the environment (the environment wins)."""
    return {k: v for k in setting_names() if (v := given(k))}


def _parser() -> argparse.ArgumentParser:
    """The flags of the settings table (mlx_ring/settings.py), each defaulting to its variable."""
    p = argparse.ArgumentParser(
        description="Serve one model split across the ranks of an MLX ring."
    )
    for name in names(FLAG):
        s = SETTINGS[name]
        p.add_argument(
            s.flag,
            default=read(name),
            type=None if s.parse is str else s.parse,
            choices=s.choices or None,
            help=s.help or None,
        )
    p.add_argument(
        "--prepare",
        action="store_true",
        help="resolve/convert the model, print its folder and exit",
    )
    return p


def ring_away(text: str | None) -> dict | None:
    """RING_AWAY's JSON {"hosts": [...], "since": epoch seconds, "why": "..."},
    or None when unset."""
    if text is None:
        return None
    try:
        away = json.loads(text)
    except json.JSONDecodeError:
        away = None
    if not (
        isinstance(away, dict)
        and isinstance(away.get("hosts"), list)
        and isinstance(away.get("since", 0), (int, float))
    ):
        raise ValueError(
            f'RING_AWAY={text!r} must be JSON such as {{"hosts": ["mac2"], '
            '"since": 1764000000, '
            '"why": "..."}} (the launcher sets it; unset it otherwise)'
        )
    return away


def parse_config(argv: list[str] | None = None) -> tuple[Config, bool]:
    """(config, prepare_only). Flags win over environment variables, which win over `.env`."""
    load_dotenv(ROOT / ".env", override=False)
    a = _parser().parse_args(argv)
    try:
        layers = tuple(int(x) for x in a.layers.split(",")) if a.layers else None
    except ValueError:
        raise ValueError(
            f"LAYERS={a.layers!r} must be comma-separated integers, e.g. 3,2,2"
        ) from None
    if not 0 < a.port < 65536:
        raise ValueError(f"PORT={a.port} is not a TCP port; pick one in 1-65535")
    if a.max_queue < 1 or a.max_active < 1:
        raise ValueError("MAX_QUEUE and MAX_ACTIVE must be at least 1")
    if a.groups != "auto" and not (a.groups.isdigit() and int(a.groups) > 0):
        raise ValueError(
            f"GROUPS={a.groups!r} must be auto or a number of decode groups (at least 1)"
        )
    if a.prefill_chunk != "auto" and not (a.prefill_chunk.isdigit() and int(a.prefill_chunk) > 0):
        raise ValueError(
            f"PREFILL_CHUNK={a.prefill_chunk!r} must be auto or a number of tokens (at least 1)"
        )
    chunk = 0 if a.prefill_chunk == "auto" else int(a.prefill_chunk)
    disk_gb = None if a.prompt_disk_gb == "auto" else _number(a.prompt_disk_gb)
    if disk_gb is not None and not disk_gb >= 0:
        raise ValueError(
            f"PROMPT_DISK_GB={a.prompt_disk_gb!r} must be auto or GB >= 0 (0 turns it off)"
        )
    floor_gb = None if a.prompt_disk_floor_gb == "auto" else _number(a.prompt_disk_floor_gb)
    if floor_gb is not None and not floor_gb >= 0:
        raise ValueError(f"PROMPT_DISK_FLOOR_GB={a.prompt_disk_floor_gb!r} must be auto or GB >= 0")
    if a.prompt_cache_block < 1:
        raise ValueError(
            f"PROMPT_CACHE_BLOCK={a.prompt_cache_block} must be >= 1 (tokens a block holds)"
        )
    if a.kv_bits not in (0, 8, 4):
        raise ValueError(
            f"KV_BITS={a.kv_bits} must be one of 0 (off), 8 or 4 (bits a value of the "
            "prompt-cache blocks)"
        )
    if a.kv_tokens < 0:
        raise ValueError(
            f"KV_TOKENS={a.kv_tokens} must be >= 0 (tokens of KV cache to keep room for)"
        )
    cache_gb = None if a.prompt_cache_gb == "auto" else _number(a.prompt_cache_gb)
    if cache_gb is not None and not cache_gb >= 0:
        raise ValueError(
            f"PROMPT_CACHE_GB={a.prompt_cache_gb!r} must be auto or GB >= 0 (GB of RAM per rank at "
            "most; 0 turns the RAM tier off)"
        )
    if not 0 <= a.draft_tokens <= 16:
        raise ValueError(
            f"DRAFT_TOKENS={a.draft_tokens} must be 0 (off) to 16 (tokens drafted per step)"
        )
    if a.draft_model and not a.draft_tokens:
        raise ValueError(
            (
                f"DRAFT_MODEL={a.draft_model} needs DRAFT_TOKENS, the most tokens it drafts per "
                "step: set e.g. DRAFT_TOKENS=4"
            )
        )
    if a.step_timeout <= 0 or a.drain_timeout < 0:
        raise ValueError("STEP_TIMEOUT must be > 0 and DRAIN_TIMEOUT >= 0 (seconds)")
    if a.ring_socket_buffer < 0:
        raise ValueError(
            f"RING_SOCKET_BUFFER={a.ring_socket_buffer} must be >= 0 (bytes; 0: the system's)"
        )
    if a.max_body_bytes < 1024:
        raise ValueError(
            (
                f"MAX_BODY_BYTES={a.max_body_bytes} must be at least 1024 (bytes; "
                "the default is 16 MiB)"
            )
        )
    if a.served_model_name is not None and not a.served_model_name.strip():
        raise ValueError(
            "SERVED_MODEL_NAME is blank; give the model's name, or unset it for MODEL's own name"
        )
    cert, key = read("TLS_CERT"), read("TLS_KEY")
    if bool(cert) != bool(key):
        raise ValueError(
            "TLS_CERT and TLS_KEY go together: set both (PEM files) for HTTPS, or neither for HTTP"
        )
    plan = None
    if read("RING_PLAN"):
        strategy, _, sizes = read("RING_PLAN").partition(":")
        plan = (strategy, tuple(int(x) for x in sizes.split(",")))
    cfg = Config(
        model=a.model,
        weights=a.weights,
        host=a.host,
        port=a.port,
        cache_dir=Path(a.cache_dir).expanduser(),
        log_dir=ROOT / Path(a.log_dir).expanduser(),
        layers=layers,
        max_queue=a.max_queue,
        max_active=a.max_active,
        default_max_tokens=a.max_tokens,
        log_level=a.log_level.upper(),
        step_timeout=a.step_timeout,
        drain_timeout=a.drain_timeout,
        api_key=read("API_KEY"),
        groups=0 if a.groups == "auto" else int(a.groups),
        prefill_chunk=chunk,
        strategy=a.strategy,
        parallel=a.parallel,
        kv_tokens=a.kv_tokens,
        prompt_cache_gb=cache_gb,
        prompt_disk_gb=disk_gb,
        prompt_disk_floor_gb=floor_gb,
        prompt_cache_dir=None
        if a.prompt_cache_dir == "auto"
        else Path(a.prompt_cache_dir).expanduser(),
        prompt_cache_block=a.prompt_cache_block,
        kv_bits=a.kv_bits,
        draft_tokens=a.draft_tokens,
        draft_model=a.draft_model,
        hostfile=ROOT / Path(a.hostfile).expanduser(),
        max_tokens_limit=a.max_tokens_limit,
        ring_socket_buffer=a.ring_socket_buffer,
        model_id=read("RING_MODEL_ID"),
        plan=plan,
        restarts=read("RING_RESTARTS"),
        tls=(Path(cert).expanduser(), Path(key).expanduser()) if cert else None,
        api_keys_file=Path(read("API_KEYS_FILE")).expanduser() if read("API_KEYS_FILE") else None,
        receive_apart=receive_apart_setting(),
        ring_frames=read("RING_FRAMES"),
        ring_verbose=a.ring_verbose == "1",
        max_body_bytes=a.max_body_bytes,
        away=ring_away(read("RING_AWAY")),
        served_model_name=a.served_model_name,
        model_aliases=tuple(n.strip() for n in a.model_aliases.split(",") if n.strip()),
    )
    return cfg, a.prepare
