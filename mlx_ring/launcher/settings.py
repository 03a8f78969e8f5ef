"""The launcher's own settings, read once from the environment and `.env` (the environment wins).
The ranks' settings (config.setting_names) are read by server.py; these are the ones the launcher needs
before any rank exists."""

import os
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

from mlx_ring.config import ROOT


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
    failover_after: float = 0  # FAILOVER_AFTER: seconds a host may stay away before the ring serves without it (0: never)
    tls: tuple[str, str] | None = None  # TLS_CERT, TLS_KEY: rank 0's HTTPS, which the stand-in serves too

    @property
    def planned(self) -> Path:
        """What `launcher.up up` writes for mlx.launch: its hostfile, the ranks' settings, rank 0, the URL."""
        return self.log_dir / "launch"

    @property
    def state_file(self) -> Path:
        """The supervisor's state: serving, waiting for a host, ... (launcher/waiting.py)."""
        return self.planned / "state.json"

    @property
    def url(self) -> str:
        """The URL as planned for this start, else as the settings say."""
        try:
            return (self.planned / "url").read_text().strip()
        except OSError:
            return f"http://{'127.0.0.1' if self.host == '0.0.0.0' else self.host}:{self.port}"


def _number(name: str, value: str, kind=int):
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be a number; fix it in the environment or .env") from None


def read_settings(env: dict | None = None, root: Path = ROOT) -> LaunchSettings:
    """The settings from `env` (default: this process's environment) over `root/.env`."""
    env = dict(os.environ) if env is None else env
    dot = dotenv_values(root / ".env") if (root / ".env").is_file() else {}

    def get(name: str, default: str) -> str:
        return env.get(name) or dot.get(name) or default

    return LaunchSettings(
        hostfile=get("HOSTFILE", "hosts.json"), host=get("HOST", "127.0.0.1"),
        port=_number("PORT", get("PORT", "8100")), ring_port=_number("RING_PORT", get("RING_PORT", "32323")),
        startup_timeout=_number("STARTUP_TIMEOUT", get("STARTUP_TIMEOUT", "600"), float),
        drain_timeout=_number("DRAIN_TIMEOUT", get("DRAIN_TIMEOUT", "30"), float),
        max_restarts=_number("MAX_RESTARTS", get("MAX_RESTARTS", "5")),
        log_dir=root / get("LOG_DIR", "logs"), cuda=get("CUDA", "0") == "1",
        failover_after=_number("FAILOVER_AFTER", get("FAILOVER_AFTER", "0"), float),
        tls=(get("TLS_CERT", ""), get("TLS_KEY", "")) if get("TLS_CERT", "") and get("TLS_KEY", "") else None)
