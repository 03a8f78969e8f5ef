"""The launcher's own settings, read once from the environment and `.env` (the environment wins).
The ranks' settings (config.setting_names) are read by server.py; these are the ones the launcher
needs before any rank exists. Both draw their names, defaults and parsers from
mlx_ring/settings.py."""

import os
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

from mlx_ring.config import ROOT
from mlx_ring.rundir import RunDir
from mlx_ring.settings import read


@dataclass(frozen=True)
class LaunchSettings:
    hostfile: str
    host: str
    port: int
    ring_port: int
    startup_timeout: float
    drain_timeout: float
    max_restarts: int
    log_dir: Path  # relative to the checkout unless absolute, as on every host
    cuda: bool  # CUDA=1: the environment gets mlx[cuda13]
    # FAILOVER_AFTER: seconds a host may stay away before the ring serves without it (0: never)
    failover_after: float = 0
    # TLS_CERT, TLS_KEY: rank 0's HTTPS, which the stand-in serves too
    tls: tuple[str, str] | None = None

    @property
    def run(self) -> RunDir:
        """The files the launcher and the ranks share under LOG_DIR (mlx_ring/rundir.py)."""
        return RunDir(self.log_dir)

    @property
    def planned(self) -> Path:
        """What `launcher.up up` writes for mlx.launch: its hostfile, the ranks' settings, rank
        0, the URL."""
        return self.run.launch.root

    @property
    def state_file(self) -> Path:
        """The supervisor's state: serving, waiting for a host, ... (launcher/waiting.py)."""
        return self.run.launch.state

    @property
    def url(self) -> str:
        """The URL as planned for this start, else as the settings say."""
        try:
            return self.run.launch.url.read_text().strip()
        except OSError:
            return f"http://{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}"


def read_settings(env: dict | None = None, root: Path = ROOT) -> LaunchSettings:
    """The settings from `env` (default: this process's environment) over `root/.env`, as the
    settings table (mlx_ring/settings.py) defaults and parses them."""
    env = dict(os.environ) if env is None else env
    dot = dotenv_values(root / ".env") if (root / ".env").is_file() else {}

    def get(name: str):
        return read(name, env, dot)

    return LaunchSettings(
        hostfile=get("HOSTFILE"),
        host=get("HOST"),
        port=get("PORT"),
        ring_port=get("RING_PORT"),
        startup_timeout=get("STARTUP_TIMEOUT"),
        drain_timeout=get("DRAIN_TIMEOUT"),
        max_restarts=get("MAX_RESTARTS"),
        log_dir=root / get("LOG_DIR"),
        cuda=get("CUDA") == "1",
        failover_after=get("FAILOVER_AFTER"),
        tls=(get("TLS_CERT"), get("TLS_KEY")) if get("TLS_CERT") and get("TLS_KEY") else None,
    )
