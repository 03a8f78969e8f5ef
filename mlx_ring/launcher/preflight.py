"""What the launcher learns of every host before the ring starts, for `./launch.sh check` and
`./launch.sh start` (up.py): each host's facts, read over ssh at once, and every problem found: a
host that does not answer or no longer owns its ring address, a Mac's firewall that drops the ring's
connections, code or an environment that differs from this machine's.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlx_ring.config import ROOT, Config
from mlx_ring.hostfile import Host, load_hosts
from mlx_ring.hosts import provision, ssh
from mlx_ring.hosts.address_checks import addresses_reset, hostfile_warnings
from mlx_ring.hosts.facts import read_facts
from mlx_ring.hosts.identity import versions
from mlx_ring.macos_settings import firewall_advice, firewall_blocks, power_advice, stealth_note
from mlx_ring.planning.auto import ModeChoice
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.modes import AllSum
from mlx_ring.planning.plan import LayerPlan, ModelSpec
from mlx_ring.planning.promptcache import Blocks
from mlx_ring.rundir import RunDir


@dataclass(frozen=True)
class Launch:
    """The launcher's own settings, read once in `main()`."""

    ring_port: int
    remote_cache: str  # CACHE_DIR as every host reads it ("": each host's default, under its home)
    ssh_config: str | None  # RING_SSH_CONFIG: the ssh config the ring's own one includes
    provision: bool  # PROVISION: bring hosts up to date, else only check them
    caps_env: str  # MLX_RING_CAPS, for the probes (tests, or to pretend)
    settings: dict  # rank 0's settings, which every rank gets (config.setting_names)


@dataclass
class Preflight:
    """What the launcher learnt: hosts, their facts, the plan, and every problem found."""

    cfg: Config
    opts: Launch
    hosts: list[Host]
    conf: Path
    facts: dict  # ssh name -> Facts
    problems: list[str]
    # ssh names that did not answer: they may come back
    unreachable: list[str] = field(default_factory=list)
    # ssh name -> ring address it lost (Thunderbolt): it may come back
    unaddressed: dict = field(default_factory=dict)
    # check: what `start` sets up first (hosts not set up yet)
    pending: list[str] = field(default_factory=list)
    plan: LayerPlan | None = None
    caps: list[Capabilities] | None = None
    model: Path | None = None
    spec: ModelSpec | None = None  # the model's sizes, from its weight headers
    manifest: dict | None = None
    # each host's capabilities as probed, before hosts.json's keys
    measured: list[Capabilities] | None = None
    # each rank's share in tensor mode, or why the model does not split
    split: list[float] | str = ""
    allsum: AllSum | None = None  # the ring's all_sum: measured by check, else cached or a default
    # each hop (rtt ms, Gbit/s), as check measured them
    links: list[tuple[float, float]] | None = None
    choice: ModeChoice | None = None  # the mode and why (PARALLEL)
    # how the ranks keep the prompt cache's blocks, and each rank's RAM tier (GB), as planned
    blocks: Blocks | None = None
    kept: list[float] | None = None


def each_host(ring: Preflight, fn) -> dict:
    """fn(host) for every distinct remote host at once; exceptions become that host's problem."""
    names = sorted({h.ssh for h in ring.hosts if not h.local})
    out = {}
    with ThreadPoolExecutor(max(1, len(names))) as pool:
        for name, fut in [(n, pool.submit(fn, n)) for n in names]:
            try:
                out[name] = fut.result()
            except ValueError as e:  # ssh.SshError included
                ring.problems.append(str(e))
                if isinstance(e, ssh.SshError):
                    ring.unreachable.append(name)
    return out


def read_all(ring: Preflight, files: list[str]) -> dict:
    return each_host(
        ring, lambda n: read_facts(ring.conf, n, False, ROOT, ring.opts.remote_cache, files)
    )


def gather(cfg: Config, opts: Launch, files: list[str]) -> Preflight:
    hosts = load_hosts(cfg.hostfile, opts.ring_port)
    conf = ssh.write_config(RunDir(cfg.log_dir).ssh_config, opts.ssh_config)
    ring = Preflight(cfg, opts, hosts, conf, {}, [])
    ring.facts = read_all(ring, files)
    if any(h.local for h in hosts):
        ring.facts["127.0.0.1"] = read_facts(conf, "127.0.0.1", True, ROOT, str(cfg.cache_dir), [])
    for h in hosts:
        f = ring.facts.get(h.ssh)
        if f and f.addresses and h.address not in f.addresses:
            named = f" ({h.named} resolves to it)" if h.named != h.address else ""
            if addresses_reset(f.system, f.interfaces, h.address):
                # Waited for, as a host away is: the addresses come back once set again.
                ring.unaddressed[h.ssh] = h.address
                ring.problems.append(
                    f"{'this Mac' if h.local else h.ssh} (rank {h.rank}) answers but no longer "
                    f"holds its ring address {h.address}{named}, which is on none of its networks "
                    "now: its Thunderbolt addresses were reset (a restart undoes addresses set "
                    "with ifconfig; so does moving a cable); `./launch.sh hosts --over "
                    "thunderbolt --apply --write` sets them again, to last across restarts (not a "
                    f"Thunderbolt address? put one of its own, {', '.join(f.addresses)}, in "
                    "its hosts.json entry)"
                )
                continue
            ring.problems.append(
                f"{h.ssh} (rank {h.rank}) does not own ring address {h.address}{named}: its "
                f"addresses are {', '.join(f.addresses)}; put one of them in its hosts.json entry "
                "(Macs cabled with Thunderbolt: `./launch.sh hosts --over thunderbolt` "
                "proposes the addresses)"
            )
    macs = sorted(
        n for n, f in ring.facts.items() if n != "127.0.0.1" and f.system.startswith("Darwin")
    )
    if macs and provision.closed_to_ssh_on_macos(ROOT):
        ring.problems.append(
            f"{macs[0]} is a Mac, where {ROOT} is closed to ssh by macOS privacy controls; "
            f"{provision.location_advice(ROOT)}"
        )
    return ring


def where(name: str) -> str:
    return "this machine" if name == "127.0.0.1" else name


def spans_machines(ring: Preflight) -> bool:
    """Whether ranks connect from one machine to another (a firewall lets loopback through)."""
    return len({h.ssh for h in ring.hosts}) > 1


def firewall_problems(ring: Preflight) -> None:
    """A Mac's firewall that certainly drops the ring's connections is a problem: the ring would
    wait out MLX's connect timeouts and restarts, then fail without saying why."""
    if not spans_machines(ring):
        return
    for name, f in sorted(ring.facts.items()):
        blocks = firewall_blocks(replace(f.fw, on=f.firewall), f.python or ssh.env_python(ROOT))
        if blocks:
            ring.problems.append(f"{where(name)}: {blocks}")


def warnings(ring: Preflight) -> list[str]:
    """What may stop the ring yet is not certain to: ring addresses that misroute on cabled Macs, a
    Mac's firewall that may drop the ring's connections (its Python's own standing unknown), and a
    Mac's power settings that let it sleep or stay off (a Mac asleep answers no ssh)."""
    out = hostfile_warnings(ring.hosts, {n: f.interfaces for n, f in ring.facts.items()})
    multi = spans_machines(ring)
    for name, f in sorted(ring.facts.items()):
        fw = replace(f.fw, on=f.firewall)
        python = f.python or ssh.env_python(ROOT)
        said = []
        if multi and fw.app_allowed is None and not firewall_blocks(fw, python):
            said.append(firewall_advice(fw.on, python))
        said += [stealth_note(fw) if multi else None, power_advice(f.power)]
        out += [f"{where(name)}: {x}" for x in said if x]
    return out


def compare(ring: Preflight, sums: dict[str, str], found: list[str], setup: bool = False) -> None:
    """Into `found`, where a remote host's code or environment differs from this
    machine's: as a problem, or (`setup`: a check before a start that provisions) as what
    `./launch.sh start` does there."""
    mine = " ".join(versions().values())
    for name, f in sorted(ring.facts.items()):
        if name == "127.0.0.1":
            continue
        uv = "" if f.uv else "install uv, "
        if not f.checkout:
            problem = (
                f"{name} has no copy of the project at {ROOT}; `./launch.sh start` copies it there "
                "(unless PROVISION=0), or clone it there at the same path"
            )
            todo = (
                f"copy the project to {ROOT}, {uv}install its environment (uv's Python and "
                "the locked packages)"
            )
        elif not f.versions:
            problem = (
                f"{name} has the project but no environment in {ROOT}/.venv; `./launch.sh start` "
                "makes it (unless PROVISION=0), or run `./launch.sh setup` there"
            )
            todo = (
                f"{uv}install its environment in {ROOT}/.venv (uv's Python and the locked packages)"
            )
        elif f.versions != mine:
            problem = (
                f"{name} runs mlx, mlx-lm {f.versions} but this machine runs {mine}; `./launch.sh "
                "start` syncs it to uv.lock (unless PROVISION=0), or run `./launch.sh setup` there"
            )
            todo = f"sync its environment to uv.lock (mlx, mlx-lm {f.versions} there, {mine} here)"
        else:
            differ = sorted(k for k, v in sums.items() if f.sums.get(k) != v)
            if not differ:
                continue
            problem = (
                f"{name}'s copy of the project differs from this one in {len(differ)} file(s) "
                f"({', '.join(differ[:3])}); `./launch.sh start` updates it (unless "
                "PROVISION=0), or update it there"
            )
            todo = (
                f"update {len(differ)} file(s) of its copy of the project ({', '.join(differ[:3])})"
            )
        found.append(
            (
                f"{name}: `./launch.sh start` will {todo}, then send it the weights of "
                "its slice that it lacks"
            )
            if setup
            else problem
        )
