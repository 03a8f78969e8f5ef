"""`./launch.sh [command] [args]`: the commands a user types, after launch.sh has found uv and made
the environment. Extra arguments go to the program each command runs (server.py, pytest, ...)."""

import logging
import os
import subprocess
import sys

from mlx_ring import exits
from mlx_ring.config import ROOT
from mlx_ring.launcher import environment, supervisor
from mlx_ring.launcher.launch_settings import LaunchSettings, read_settings
from mlx_ring.launcher.status import status_text
from mlx_ring.launcher.waiting import describe, read_state

log = logging.getLogger("launcher")

USAGE = """usage: ./launch.sh [command] [args]
  start     install what is needed, prepare the model, bring every host in hosts.json up to date
            (code, environment, its slice of the weights), start a rank on each (the default)
  stop      stop every rank                restart   stop, then start
  status    is it up, and the per-rank layer plan and memory
  check     a preflight table per host (ssh, path, versions, memory against its slice, links,
            the ring's all_sum) and each mode's predicted tokens/s; exit 0 when all is well
  plan      print the layer plan for the hostfile and model and each mode's predicted
            tokens/s, loading no weights (--json, --model, --parallel, --strategy)
  hosts     propose ring addresses for Macs cabled with Thunderbolt, as MLX's
            distributed_config does (--over thunderbolt; --apply sets them on each Mac,
            --write saves hosts.json)
  logs      follow logs/*.log              prepare   install and convert the model only
  test      run the test suite (extra args go to pytest)
            test quick: the in-process tests (tests/unit) alone, the quick check while editing
  bench     benchmark the ring against single-process mlx_lm.server (tools/bench.py --help)
  setup     install this host's runtime environment only (the launcher runs it on every host)
Extra arguments to start go to server.py, e.g. ./launch.sh start --model ~/models/Qwen3-4B-4bit"""


QUICK = "tests/unit"  # the in-process tier: no ranks, no mlx.launch, no test hosts


def pytest_argv(args: list[str]) -> list[str]:
    """Python's arguments for `./launch.sh test [quick] [pytest args]`: the whole suite, or with
    `quick` the in-process tier alone; the rest go to pytest either way."""
    if args[:1] == ["quick"]:
        return ["-m", "pytest", QUICK, *args[1:]]
    return ["-m", "pytest", *args]


def run_python(argv: list[str]) -> None:
    """Replace this process with the environment's Python running `argv`
    (OpenBLAS preloaded for MLX)."""
    os.chdir(ROOT)
    os.execve(sys.executable, [sys.executable, *argv], environment.rank_env())


def start(s: LaunchSettings, args: list[str]) -> int:
    pid = supervisor.supervisor_pid(s)
    if pid:
        log.info("already running (pid %d) at %s", pid, s.url)
        return status(s)
    environment.ensure(cuda=s.cuda)
    rc = supervisor.start(s, args)
    return rc or status(s)


def status(s: LaunchSettings) -> int:
    pid = supervisor.supervisor_pid(s)
    if pid is None:
        log.info("not running")
        return 1
    text = status_text(s.url)
    if text is None:
        state = read_state(s.state_file)
        if state and state["state"] in ("waiting", "restarting"):
            log.info("%s", describe(state))
        else:
            log.info("launcher pid %d is up but %s/health does not answer", pid, s.url)
        return 1
    print(text, flush=True)
    state = read_state(s.state_file)
    if state and state["state"] == "failed_over":
        print(describe(state), flush=True)
    return 0


def logs(s: LaunchSettings, args: list[str]) -> int:
    s.log_dir.mkdir(parents=True, exist_ok=True)
    files = [str(p) for p in s.run.logs()]
    if not files:
        log.info("no logs yet in %s", s.log_dir)
        return 0
    follow = ["-n", "50", "-F"] if sys.stdout.isatty() else ["-n", args[0] if args else "100"]
    os.execvp("tail", ["tail", *follow, *files])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd, args = (argv[0], argv[1:]) if argv else ("start", [])
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    # Started on every host by mlx.launch (rank) or the launcher (probe): this
    # host's BLAS, then Python.
    if cmd == "rank":
        run_python(["server.py", *args])
    if cmd == "probe":
        run_python(["-m", "mlx_ring.planning.probe", *args])
    if cmd in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    try:
        s = read_settings()
        if cmd == "start":
            return start(s, args)
        if cmd == "supervise":
            return supervisor.supervise(s, args)
        if cmd == "stop":
            return supervisor.stop(s)
        if cmd == "restart":
            supervisor.stop(s)
            return start(s, args)
        if cmd == "status":
            return status(s)
        if cmd == "logs":
            return logs(s, args)
        if cmd not in ("prepare", "setup", "check", "plan", "hosts", "test", "bench"):
            log.info(
                "unknown command '%s'; use start, stop, restart, status, check, plan, hosts, "
                "logs, test, prepare, setup or bench (./launch.sh help)",
                cmd,
            )
            return exits.REFUSED
        environment.ensure(dev=cmd in ("test", "bench"), cuda=s.cuda)
    except ValueError as e:
        log.info("%s", exits.refusal(str(e)))
        return exits.REFUSED
    if cmd == "check":  # the model prepared first: the check plans its slices
        s.log_dir.mkdir(parents=True, exist_ok=True)
        if subprocess.run(
            [sys.executable, "server.py", "--prepare"],
            cwd=ROOT,
            env=environment.rank_env(),
            stdout=subprocess.DEVNULL,
        ).returncode:
            return exits.REFUSED
    if cmd == "test":
        run_python(pytest_argv(args))
    then = {
        "prepare": ["server.py", "--prepare"],
        "bench": ["tools/bench.py"],
        "check": ["-m", "mlx_ring.launcher.up", "check", "--ring-port", str(s.ring_port)],
        # later flags win
        "plan": ["-m", "mlx_ring.planning.planner", "--hostfile", s.hostfile],
        "hosts": ["-m", "mlx_ring.hosts.thunderbolt", "--hostfile", s.hostfile],
    }
    if cmd in then:
        run_python([*then[cmd], *args])
    return 0  # setup


if __name__ == "__main__":
    sys.exit(main())
