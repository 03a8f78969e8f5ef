"""Before the ring starts, from rank 0's machine: `./launch.sh check` (a preflight table) and the
first half of `./launch.sh start` (check, provision every host, plan, write mlx.launch's inputs).

Every problem found is one sentence naming the host and what to do; nothing is started until every
host is reachable, holds the same code and environment, owns its ring address, and fits its slice.
"""

import argparse
import json
import logging
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from mlx_ring import exits, settings
from mlx_ring.cache_sizes import disk_here
from mlx_ring.config import ROOT, Config, parse_config, settings_to_forward
from mlx_ring.hostfile import Host, hostfile_backend, mlx_hostfile, read_hostfile
from mlx_ring.hosts import provision
from mlx_ring.hosts.facts import Facts
from mlx_ring.hosts.identity import file_sums, runtime_files
from mlx_ring.hosts.rdma import rdma_notes, rdma_problems
from mlx_ring.hosts.weights import manifest
from mlx_ring.launcher.collectives import choose, measure_ring, unmeasured
from mlx_ring.launcher.preflight import (
    Launch,
    Preflight,
    compare,
    each_host,
    firewall_problems,
    gather,
    read_all,
    warnings,
)
from mlx_ring.launcher.shipping import send_weights
from mlx_ring.macos_settings import format_rdma
from mlx_ring.planning.assemble import serving
from mlx_ring.planning.auto import with_choice
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.planner import dtype_of, hidden_size
from mlx_ring.planning.promptcache import format_disk
from mlx_ring.planning.report import format_summary, summary
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.rundir import LaunchDir

log = logging.getLogger("up")


def plan(ring: Preflight) -> None:
    """The layer plan from every host's measured capabilities and hosts.json's keys."""
    spec = ring.spec
    measured = {}

    def measure(h: Host) -> dict:
        return provision.probe(
            ring.conf, h.ssh, h.local, ROOT, dtype_of(spec), h.rank, ring.opts.caps_env
        )

    with ThreadPoolExecutor(len(ring.hosts)) as pool:
        for h, fut in [(h, pool.submit(measure, h)) for h in ring.hosts]:
            try:
                measured[h.rank] = fut.result()
            except ValueError as e:
                ring.problems.append(str(e))
    if ring.problems:
        return
    ring.measured = [replace(Capabilities(**measured[h.rank]), host=h.ssh) for h in ring.hosts]
    choose(ring)


def bring_up(ring: Preflight, sums: dict[str, str], here: str) -> None:
    """Provision code and environment on every remote host, then the weights of each one's slice."""

    def code_and_env(name: str) -> str:
        f = ring.facts[name]
        (sent, replaced), t = provision.timed(provision.send_code, ring.conf, f, ROOT, sums)
        provision.ensure_uv(ring.conf, f, here)
        _, t_env = provision.timed(provision.sync_env, ring.conf, f, ROOT)
        # A file edited on the host is overwritten: say which, so nobody's change
        # goes without a word.
        edited = (
            f" (replaced there: {', '.join(replaced[:5])}{', ...' if len(replaced) > 5 else ''})"
            if replaced
            else ""
        )
        return (
            f"{name}: code {sent / 1e6:.1f} MB in {t:.1f} s{edited}, environment "
            f"ready in {t_env:.1f} s"
        )

    for line in each_host(ring, code_and_env).values():
        log.info("%s", line)


def launch_args(ring: Preflight, out: Path) -> None:
    """mlx.launch's hostfile and the settings every rank gets (rank 0's, whatever its host)."""
    out.mkdir(parents=True, exist_ok=True)
    d = LaunchDir(out)
    backend = hostfile_backend(ring.cfg.hostfile)
    d.backend.write_text(backend + "\n")
    d.hostfile.write_text(json.dumps(mlx_hostfile(ring.hosts, backend)))
    # The hostfile's own "envs" (MLX's form) for every rank, as mlx.launch gives them; settings win.
    envs = dict(e.split("=", 1) for e in read_hostfile(ring.cfg.hostfile)[1])
    env = (
        envs
        | ring.opts.settings
        | {
            "RING_MODEL_ID": ring.manifest["id"],
            "RING_PLAN": f"{ring.plan.strategy}:{','.join(map(str, ring.plan.sizes))}",
        }
    )
    d.env.write_text("".join(f"{k}={v}\n" for k, v in sorted(env.items())))
    rank0 = ring.hosts[0]
    d.rank0.write_text(rank0.ssh + "\n")
    host = ring.cfg.host if rank0.local or ring.cfg.host not in ("0.0.0.0", "") else rank0.address
    scheme = "https" if ring.cfg.tls else "http"
    d.url.write_text(f"{scheme}://{'127.0.0.1' if host == '0.0.0.0' else host}:{ring.cfg.port}\n")


def check_table(ring: Preflight) -> str:
    rows = [
        (
            "rank",
            "host",
            "ring address",
            "system",
            "project",
            "mlx, mlx-lm",
            "memory free",
            "slice needs",
            "rdma",
        )
    ]
    needs = (
        summary(ring.spec, ring.caps, ring.plan, ring.cfg.kv_tokens)["ranks"] if ring.plan else None
    )
    for h in ring.hosts:
        f: Facts | None = ring.facts.get(h.ssh)
        need = "-"
        if needs:
            s, e = ring.plan.ranges[ring.plan.stage_of(h.rank)]
            need = (
                f"{needs[h.rank]['needs_gb']:.2f} GB ({e - s} "
                f"layers{' + ends' if h.rank == 0 else ''})"
            )
        addr = h.address if h.named == h.address else f"{h.named} -> {h.address}"
        rows.append(
            (
                str(h.rank),
                h.ssh,
                f"{addr}:{h.port}",
                f.system if f else "unreachable",
                ("yes" if f.checkout else "missing") if f else "-",
                (f.versions or "no environment") if f else "-",
                f"{f.free_gb:.1f} of {f.memory_gb:.1f} GB" if f else "-",
                need,
                format_rdma(f.rdma) if f and f.system.startswith("Darwin") else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def check(ring: Preflight, as_json: bool) -> None:
    """The table, each neighbour link measured, and the plan's prediction with those hops."""
    from mlx_ring.hosts.link import measure_links

    table = check_table(ring)
    text, hops, predicted = "", [], None
    # links and the plan are measured by each host's environment, which is not there yet
    if ring.pending:
        text = "\n".join(
            [
                "not set up yet (`./launch.sh start` does this first, then measures "
                "the links and plans):",
                *(f"  {p}" for p in ring.pending),
            ]
        )
    elif not ring.problems:
        text, hops = measure_links(ring)
        if ring.plan and not ring.problems:
            said, ring.allsum = measure_ring(
                ring.hosts,
                ring.conf,
                ring.opts.ring_port,
                hidden_size(ring.spec),
                dtype_of(ring.spec),
                ring.cfg.cache_dir,
            )
            text, ring.links = "\n".join(x for x in (text, said) if x), hops
            choose(ring)  # again, with the links and the all_sum as measured
        if ring.plan:
            shares = ring.split if isinstance(ring.split, list) else None
            predicted = with_choice(
                summary(
                    ring.spec,
                    ring.caps,
                    ring.plan,
                    ring.cfg.kv_tokens,
                    hops,
                    shares,
                    ring.allsum,
                    ring.kept,
                    ring.blocks,
                    ring.cfg.prompt_cache_gb,
                ),
                ring.choice,
            )
            c = ring.cfg  # the disk tier as this machine sizes it
            predicted["disk_tier"] = disk_here(
                c.prompt_disk_gb, c.prompt_disk_floor_gb, c.prompt_cache_dir, c.cache_dir
            )
    notes = "\n".join(rdma_notes(ring.hosts, ring.facts, hostfile_backend(ring.cfg.hostfile)))
    if as_json:
        rdma = {n: f.rdma for n, f in ring.facts.items() if f.system.startswith("Darwin")}
        print(
            json.dumps(
                {
                    "problems": ring.problems,
                    "pending": ring.pending,
                    "links": hops,
                    "plan": predicted,
                    "rdma": rdma,
                }
            )
        )
    else:
        plan = predicted and "\n".join(
            [
                format_summary(predicted),
                format_disk(predicted["disk_tier"], predicted.get("prompt_cache", {})),
            ]
        )
        print("\n".join(x for x in (table, notes, text, plan) if x))


def run(a, cfg: Config, opts: Launch) -> Preflight:
    files = runtime_files(ROOT)
    sums = file_sums(ROOT, files)
    ring = gather(cfg, opts, files)
    if a.command == "up" and opts.provision and not ring.problems:
        bring_up(ring, sums, f"{platform.system()} {platform.machine()}")
        ring.facts |= read_all(ring, files)
    firewall_problems(ring)  # after provisioning: each host's environment Python is known
    problems, warned = rdma_problems(ring.hosts, ring.facts)
    ring.problems += problems
    for warning in [*warned, *warnings(ring)]:
        log.warning("warning: %s", warning)
    if not ring.problems:
        # Before the first start, hosts without the project are what `start` sets up: not
        # a problem to `check`.
        setup = a.command == "check" and opts.provision
        compare(ring, sums, ring.pending if setup else ring.problems, setup)
    if not ring.problems and not ring.pending:
        from mlx_ring.models.source import resolve_model

        ring.model = resolve_model(cfg.model, cfg.cache_dir, cfg.weights)
        ring.spec = serving(
            spec_from_folder(ring.model), ring.cfg.prefill_chunk, ring.cfg.max_active
        )
        ring.manifest = manifest(ring.model, cfg.cache_dir)
        plan(ring)
        # a first start: auto needs the all_sum before it ships a plan
        if a.command == "up" and unmeasured(ring):
            said, ring.allsum = measure_ring(
                ring.hosts,
                ring.conf,
                opts.ring_port,
                hidden_size(ring.spec),
                dtype_of(ring.spec),
                cfg.cache_dir,
            )
            log.info("%s", said)
            choose(ring)
        if ring.choice and a.command == "up":
            log.info("mode %s", ring.choice.reason)
    if a.command == "check":
        check(ring, a.json)
    elif not ring.problems:
        sent = send_weights(ring)
        launch_args(ring, a.out)
        LaunchDir(a.out).sent.write_text(json.dumps(sent, indent=1))
    return ring


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./launch.sh check")
    p.add_argument("command", choices=["check", "up"])
    p.add_argument("--ring-port", type=int, required=True)
    p.add_argument("--out", type=Path, help="up: where to write mlx.launch's inputs")
    p.add_argument("--json", action="store_true", help="check: machine-readable")
    a, rest = p.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        cfg, _ = parse_config(rest)  # which also reads .env into the environment
        opts = Launch(
            a.ring_port,
            settings.given("CACHE_DIR") or "",
            settings.text("RING_SSH_CONFIG"),
            settings.text("PROVISION") != "0",
            settings.text("MLX_RING_CAPS") or "",
            settings_to_forward(),
        )
        ring = run(a, cfg, opts)
    except ValueError as e:
        print(exits.refusal(str(e)), file=sys.stderr)
        return exits.REFUSED
    # for the supervisor: a host that did not answer, or lost its address, is waited
    # for; others are not
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        LaunchDir(a.out).problems.write_text(
            json.dumps(
                {
                    "problems": ring.problems,
                    "unreachable": ring.unreachable,
                    "unaddressed": ring.unaddressed,
                }
            )
        )
    for problem in ring.problems:
        print(exits.refusal(problem), file=sys.stderr)
    if a.command == "check":
        print(
            f"{len(ring.problems)} problem(s)"
            if ring.problems
            else f"no problem found; {len(ring.pending)} host(s) not set up yet, which "
            "`./launch.sh start` sets up"
            if ring.pending
            else "all hosts ready",
            file=sys.stderr,
        )
    return exits.REFUSED if ring.problems else 0


if __name__ == "__main__":
    sys.exit(main())
