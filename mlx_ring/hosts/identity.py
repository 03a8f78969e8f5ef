"""What a rank runs and serves, compared across ranks before any request: the model's contents
(its manifest id), the project's code, and the mlx / mlx-lm versions. A ring whose ranks differ
would answer garbage or fail mid-request; it refuses to start instead, naming the host."""

import hashlib
import importlib.metadata
import socket
from pathlib import Path

from mlx_ring.config import ROOT

# What a host needs to run a rank: the entry points, the lock and the pinned Python, and the
# package. Configuration (hosts.json, .env) is not code: each host keeps its own, and
# editing it restarts nothing.
CODE = (
    "server.py",
    "shard.py",
    "launch.sh",
    "pyproject.toml",
    "uv.lock",
    ".python-version",
    "README.md",
)


def runtime_files(root: Path = ROOT) -> list[str]:
    """The files every host runs, relative to `root` (no git needed: a stock Mac may have none)."""
    package = [
        p for p in (root / "mlx_ring").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    return sorted(
        [*(c for c in CODE if (root / c).is_file()), *(str(p.relative_to(root)) for p in package)]
    )


def file_sums(root: Path, files: list[str]) -> dict[str, str]:
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}


def source_id(root: Path = ROOT) -> str:
    """A hash of the code every rank runs: the runtime files, by name and contents."""
    h = hashlib.sha256()
    for name, digest in file_sums(root, runtime_files(root)).items():
        h.update(name.encode() + b"\0" + digest.encode() + b"\0")
    return h.hexdigest()[:16]


def versions() -> dict:
    return {p: importlib.metadata.version(p) for p in ("mlx", "mlx-lm")}


def identity(model_id: str) -> dict:
    return {"host": socket.gethostname(), "model": model_id, "code": source_id(), **versions()}


def disagreement(rows: list[dict]) -> str | None:
    """A sentence naming the first rank that differs from rank 0 and how, or None."""
    lead = rows[0]
    fixes = {
        "model": "every rank must load the same model: set MODEL once, in rank 0's "
        "environment or .env, and start with ./launch.sh (it sends each host its slice)",
        "code": (
            "start with ./launch.sh, which copies this checkout to every host (or update "
            "that host's checkout)"
        ),
        "mlx": (
            "run ./launch.sh, which syncs every host's environment to uv.lock (or `uv "
            "sync --frozen` there)"
        ),
        "mlx-lm": (
            "run ./launch.sh, which syncs every host's environment to uv.lock (or `uv "
            "sync --frozen` there)"
        ),
    }
    for rank, row in enumerate(rows[1:], start=1):
        for key, fix in fixes.items():
            if row.get(key) != lead.get(key):
                return (
                    f"rank {rank} on host {row.get('host')} has {key} {row.get(key)} but rank 0 on "
                    f"{lead.get('host')} has {lead.get(key)}; {fix}"
                )
    return None
