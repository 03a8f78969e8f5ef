"""The run directory: every file the launcher, its start-up step (launcher/up.py) and the ranks hand
each other under LOG_DIR (`logs/`, relative to the checkout on every host unless absolute) and its
`launch/` folder, named once. Each file's writer and readers take its path from here."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LaunchDir:
    """`logs/launch/`: what `launcher.up up` plans for mlx.launch, and
    the supervisor's own state."""

    root: Path

    @property
    def hostfile(self) -> Path:
        """mlx.launch's hostfile: ssh names and resolved ring addresses (hostfile.mlx_hostfile)."""
        return self.root / "hosts.json"

    @property
    def backend(self) -> Path:
        """MLX's backend mlx.launch starts: ring, jaccl or jaccl-ring (hostfile.ring_backend)."""
        return self.root / "backend"

    @property
    def env(self) -> Path:
        """The settings every rank gets, NAME=value a line (mlx.launch --env)."""
        return self.root / "env"

    @property
    def rank0(self) -> Path:
        """The ssh name of rank 0's host ("127.0.0.1": this machine)."""
        return self.root / "rank0"

    @property
    def url(self) -> Path:
        """The API's URL as planned for this start."""
        return self.root / "url"

    @property
    def sent(self) -> Path:
        """What provisioning sent each host."""
        return self.root / "sent.json"

    @property
    def problems(self) -> Path:
        """Why the last `up` could not start: problems, and the hosts that did
        not answer (waited for)."""
        return self.root / "problems.json"

    @property
    def state(self) -> Path:
        """The supervisor's state: serving, waiting for a host, ... (launcher/waiting.py)."""
        return self.root / "state.json"

    @property
    def failover_hostfile(self) -> Path:
        """hosts.json less the hosts a failed-over ring serves without."""
        return self.root / "hosts.failover.json"


@dataclass(frozen=True)
class RunDir:
    """`logs/` on every host: the ranks' logs and pid files, and on the launcher's host its own."""

    root: Path

    @property
    def launch(self) -> LaunchDir:
        return LaunchDir(self.root / "launch")

    @property
    def launcher_log(self) -> Path:
        """The supervisor's output: each attempt, restart and the reason for it."""
        return self.root / "launcher.log"

    @property
    def launcher_pid(self) -> Path:
        return self.root / "launcher.pid"

    @property
    def attempt_log(self) -> Path:
        """mlx.launch's output (every rank's) for the current attempt."""
        return self.root / "attempt.log"

    @property
    def ring_pgid(self) -> Path:
        """The process group of the current attempt's mlx.launch."""
        return self.root / "ring.pgid"

    @property
    def ssh_config(self) -> Path:
        """The ring's own ssh config (hosts/ssh.py), which includes RING_SSH_CONFIG."""
        return self.root / "ssh_config"

    @property
    def broken(self) -> Path:
        """Why the ring broke, as the launcher saw it: rank 0 reads it on its SIGUSR1."""
        return self.root / "ring.broken"

    @property
    def tempfiles(self) -> Path:
        """Per rank pid, mlx.launch's temporary files it leaves (ring/leftovers.py)."""
        return self.root / "tempfiles"

    def rank_log(self, rank: int) -> Path:
        return self.root / f"rank{rank}.log"

    def rank_pid(self, rank: int) -> Path:
        return self.root / f"rank{rank}.pid"

    def logs(self) -> list[Path]:
        """Every log here, for `./launch.sh logs`."""
        return sorted(self.root.glob("*.log"))


def log_as_rank(rank: int, log_dir: Path | None, level: str) -> None:
    """Every line of this process carries rank and host, to stderr and (with `log_dir`) to the
    rank's own log file there (`RunDir.rank_log`), on its own machine."""
    import logging
    import socket
    import sys

    host = socket.gethostname()

    class Tag(logging.Filter):
        def filter(self, record):
            record.rank, record.host = rank, host
            return True

    fmt = logging.Formatter(
        "%(asctime)s [rank %(rank)d %(host)s] %(levelname)s %(name)s: %(message)s"
    )
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(RunDir(log_dir).rank_log(rank)))
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(Tag())
    logging.basicConfig(level=level, handlers=handlers, force=True)
