"""Healing waits for a Mac whose Thunderbolt addresses were reset, as for a host away: the
launcher's preflight tells it apart from a wrong hosts.json address (on recorded macOS ifconfig
outputs), and the supervisor's restart waits until the Mac holds its ring address again (read
through an ifconfig shim); a host the ring served without is taken back only after a steady run
of answers and a probe computed on its device (a Mac in Power Nap answers for moments, its GPU
off)."""

import json
import threading

from mlx_ring.hosts.address_checks import addresses_reset
from mlx_ring.launcher import healing
from mlx_ring.launcher.healing import Away, restart_hosts
from mlx_ring.launcher.launch_settings import LaunchSettings
from mlx_ring.launcher.waiting import read_state
from tests.unit.hosts.test_thunderbolt import DATA, THREE, facts


def test_a_thunderbolt_address_lost_is_told_apart_from_a_wrong_one():
    # bridge0 back, no /30 on its ports
    restarted = facts("mini-b.local", THREE["mini-b.local"]).interfaces
    assert addresses_reset("Darwin arm64", restarted, "192.168.0.2")
    # On its LAN's subnet: a changed (DHCP) or mistyped address, which hosts.json must fix.
    assert not addresses_reset("Darwin arm64", restarted, "192.168.1.99")
    # self-assigned: the bridge's own
    assert not addresses_reset("Darwin arm64", restarted, "169.254.77.9")
    # no Thunderbolt setup off a Mac
    assert not addresses_reset("Linux x86_64", restarted, "192.168.0.2")


def test_up_names_the_reset_and_its_fix_and_marks_the_mac_to_wait_for(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mlx_ring.launcher import preflight

    # This Mac after a restart, as its commands answer: bridge0 back, no /30
    # on its Thunderbolt ports.
    macos, stem = DATA.parent, DATA / THREE["mini-b.local"]
    answers = {
        "uname": 'case "$1" in -m) echo arm64;; *) echo Darwin;; esac',
        "ifconfig": f"cat '{stem}.ifconfig.txt'",
        "sysctl": f"cat '{macos}/hw_memsize_16gb.txt'",
        "vm_stat": f"cat '{macos}/vm_stat_apple_silicon.txt'",
    }
    (tmp_path / "bin").mkdir()
    for name, body in answers.items():
        (tmp_path / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / "bin" / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    (tmp_path / "hosts.json").write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["192.168.0.2"]}]))
    cfg = SimpleNamespace(
        hostfile=tmp_path / "hosts.json", log_dir=tmp_path / "logs", cache_dir=tmp_path / "cache"
    )
    ring = preflight.gather(cfg, preflight.Launch(32323, "", None, False, "", {}), [])
    (problem,) = ring.problems
    assert problem.startswith(
        "this Mac (rank 0) answers but no longer holds its ring address 192.168.0.2, which is on "
        "none of its networks now: its Thunderbolt addresses were reset"
    )
    assert "`./launch.sh hosts --over thunderbolt --apply --write` sets them again" in problem
    assert (
        "192.168.1.41" in problem
        and ring.unaddressed == {"127.0.0.1": "192.168.0.2"}
        and not ring.unreachable
    )

    (tmp_path / "hosts.json").write_text(
        json.dumps([{"ssh": "127.0.0.1", "ips": ["192.168.1.99"]}])
    )
    ring = preflight.gather(cfg, preflight.Launch(32323, "", None, False, "", {}), [])
    assert ring.problems[0].startswith(
        "127.0.0.1 (rank 0) does not own ring address 192.168.1.99: its addresses are "
    )
    assert ring.unaddressed == {}


def test_restart_waits_for_a_mac_to_hold_its_ring_address_again(tmp_path, monkeypatch):
    # This Mac's ifconfig, before and after `hosts --over thunderbolt --apply`
    # sets the address again.
    stem = DATA / THREE["mini-b.local"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ifconfig").write_text(
        f"#!/bin/sh\nif [ -f {tmp_path}/applied ]; then cat '{stem}.ifconfig-applied.txt'; else "
        f"cat '{stem}.ifconfig.txt'; fi\necho polled >> {tmp_path}/polls\n"
    )
    (tmp_path / "bin" / "ifconfig").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(healing, "POLL_S", 0.05)
    s = LaunchSettings("hosts.json", "127.0.0.1", 0, 32323, 60, 5, 0, tmp_path / "logs", False)
    s.planned.mkdir(parents=True)
    runs = []

    # up.py's verdict, as `up` writes it for the supervisor
    def hosts_up(settings, args, hostfile=None):
        runs.append((tmp_path / "applied").exists())
        if not runs[-1]:
            (s.planned / "problems.json").write_text(
                json.dumps(
                    {
                        "problems": [
                            "this Mac (rank 1) answers but no longer holds its ring "
                            "address 192.168.0.2, ..."
                        ],
                        "unreachable": [],
                        "unaddressed": {"127.0.0.1": "192.168.0.2"},
                    }
                )
            )
            return 2
        return 0

    monkeypatch.setattr(healing, "hosts_up", hosts_up)

    def apply_later():  # the user runs --apply once the supervisor has looked a few times
        while (
            not (tmp_path / "polls").exists() or len((tmp_path / "polls").read_text().split()) < 3
        ):
            threading.Event().wait(0.02)
        (tmp_path / "applied").touch()

    t = threading.Thread(target=apply_later)
    t.start()
    assert restart_hosts(s, [], threading.Event(), Away())
    t.join()
    assert runs == [False, True]
    state = read_state(s.state_file)
    assert (
        state["state"] == "waiting"
        and state["hosts"] == ["127.0.0.1"]
        and "192.168.0.2" in state["why"]
    )


def test_other_problems_still_end_the_supervision(tmp_path, monkeypatch):
    s = LaunchSettings("hosts.json", "127.0.0.1", 0, 32323, 60, 5, 0, tmp_path / "logs", False)
    s.planned.mkdir(parents=True)

    def hosts_up(settings, args, hostfile=None):
        (s.planned / "problems.json").write_text(
            json.dumps(
                {
                    "problems": ["mac-b (rank 1) does not own ring address 192.168.1.99"],
                    "unreachable": [],
                    "unaddressed": {},
                }
            )
        )
        return 2

    monkeypatch.setattr(healing, "hosts_up", hosts_up)
    assert not restart_hosts(s, [], threading.Event(), Away())


def test_failover_hostfile_keeps_an_mlx_hostfiles_envs(tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            {
                "backend": "ring",
                "envs": ["MLX_METAL_FAST_SYNCH=1"],
                "hosts": [
                    {"ssh": "mac-a", "ips": ["192.168.0.5"], "rdma": []},
                    {"ssh": "mac-b", "ips": ["192.168.0.2"], "rdma": []},
                ],
            }
        )
    )
    s = LaunchSettings(str(hostfile), "127.0.0.1", 0, 32323, 60, 5, 0, tmp_path / "logs", False)
    s.planned.mkdir(parents=True)
    reduced = json.loads(healing.without(s, ["mac-b"]).read_text())
    assert reduced == {
        "backend": "ring",
        "envs": ["MLX_METAL_FAST_SYNCH=1"],
        "hosts": [{"ssh": "mac-a", "ips": ["192.168.0.5"], "rdma": []}],
    }


def test_a_host_away_is_back_for_good_only_after_a_steady_run_and_a_probe():
    from mlx_ring.launcher.healing import Steady

    now, answers, probes = [0.0], [], []
    steady = Steady(
        lambda h: answers.pop(0), lambda h: probes.pop(0), steady_s=15, clock=lambda: now[0]
    )

    def poll(answer: bool, probe: bool | None = None) -> bool:
        answers.append(answer)
        if probe is not None:
            probes.append(probe)
        got = steady("mini-b")
        now[0] += 3
        return got

    # Power Nap: a few answers, then none; each miss starts the run over
    assert not any(poll(a) for a in [True, True, False, True, True, True, False])
    assert not any(poll(True) for _ in range(5))  # 0..12 s of answers: not yet
    assert not poll(True, probe=False)  # 15 s, but its device did not compute: over again
    assert not any(poll(True) for _ in range(5))
    assert poll(True, probe=True) and not answers and not probes


def test_the_probe_computes_on_this_machine_under_the_projects_environment(tmp_path):
    from mlx_ring.launcher.healing import computes

    assert computes(tmp_path / "ssh_config", "127.0.0.1")
