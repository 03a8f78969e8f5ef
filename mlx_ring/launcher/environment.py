"""The project's environment on this host: uv's locked sync, and on a Linux CPU Debian's OpenBLAS,
preloaded into every rank (MLX's bundled BLAS is the slow reference one, ~50x slower)."""

import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

from mlx_ring import settings
from mlx_ring.config import ROOT

log = logging.getLogger("launcher")

OPENBLAS = Path(f"/usr/lib/{platform.machine()}-linux-gnu/openblas-pthread/libblas.so.3")


def find_uv() -> str:
    """uv as launch.sh found it (UV), else on PATH or where its installers put it."""
    for uv in (
        settings.text("UV"),
        shutil.which("uv"),
        Path.home() / ".local/bin/uv",
        Path.home() / ".cargo/bin/uv",
    ):
        if uv and Path(uv).is_file():
            return str(uv)
    raise ValueError(
        "uv is not installed; run ./launch.sh, which installs it, or see https://docs.astral.sh/uv/"
    )


def sync_argv(uv: str, *, dev: bool, cuda: bool) -> list[str]:
    """`uv sync` as the launcher runs it: the lock exactly, runtime only unless `dev` (tests,
    bench); --inexact keeps what a dev sync added, so switching commands reinstalls nothing."""
    return [
        uv,
        "sync",
        "--frozen",
        "--quiet",
        "--inexact",
        *([] if dev else ["--no-dev"]),
        *(["--extra", "cuda"] if cuda else []),
    ]


def sync(*, dev: bool = False, cuda: bool = False) -> None:
    """The locked environment in .venv: from uv's cache when it holds everything (a host the
    launcher provisions may have no network), else downloading."""
    argv = sync_argv(find_uv(), dev=dev, cuda=cuda)
    if subprocess.run([*argv, "--offline"], cwd=ROOT, stderr=subprocess.DEVNULL).returncode:
        p = subprocess.run(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        if p.returncode:
            raise ValueError(
                f"installing the environment failed ({p.stderr.strip()[-400:]}); run "
                f"`{' '.join(argv[1:])}` in {ROOT} to see why"
            )


def install_openblas() -> None:
    """Debian's OpenBLAS where we may install it (Linux, root, apt-get);
    quietly nothing otherwise."""
    if (
        platform.system() != "Linux"
        or OPENBLAS.exists()
        or os.geteuid() != 0
        or not shutil.which("apt-get")
    ):
        return
    log.info("installing OpenBLAS for MLX's CPU backend (apt-get install libopenblas0-pthread)...")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if subprocess.run(
        ["apt-get", "install", "-y", "-qq", "libopenblas0-pthread"], **quiet
    ).returncode:
        subprocess.run(["apt-get", "update", "-qq"], **quiet)
        subprocess.run(["apt-get", "install", "-y", "-qq", "libopenblas0-pthread"], **quiet)


def rank_env(env: dict | None = None) -> dict:
    """The environment a rank or probe runs in: OpenBLAS preloaded where this host has it."""
    env = dict(os.environ if env is None else env)
    if (
        platform.system() == "Linux"
        and OPENBLAS.exists()
        and str(OPENBLAS) not in env.get("LD_PRELOAD", "")
    ):
        env["LD_PRELOAD"] = ":".join(x for x in (str(OPENBLAS), env.get("LD_PRELOAD")) if x)
    return env


def ensure(*, dev: bool = False, cuda: bool = False) -> None:
    """The environment and (Linux) OpenBLAS, each a no-op when already there."""
    sync(dev=dev, cuda=cuda)
    install_openblas()
    if platform.system() == "Linux" and not OPENBLAS.exists():
        log.info(
            "note: OpenBLAS not found; the CPU backend will be slow (install libopenblas0-pthread)"
        )
