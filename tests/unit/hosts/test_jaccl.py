"""JACCL (RDMA over Thunderbolt 5) from hosts.json to mlx.launch: the hostfile MLX's own
`mlx.distributed_config --backend jaccl|jaccl-ring` writes (its functions run here on the
recorded Thunderbolt outputs), the backend chosen from it, and what the ranks get from the real
`mlx.launch` started our way and started MLX's way on the same hostfile (this Linux wheel has no
JACCL, so the ranks only report what they were given)."""

import io
import json
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_thunderbolt import THREE, TWO, facts

from mlx_ring.hostfile import (
    format_hostfile,
    load_hosts,
    read_hostfile,
    ring_backend,
    without_ranks,
)
from mlx_ring.hosts import thunderbolt as tb
from mlx_ring.ring.launch import under_feed
from mlx_ring.rundir import LaunchDir

cfg = tb.mlx_config


def mlx_writes(macs: dict, backend: str, tmp_path, monkeypatch) -> Path:
    """The hostfile `mlx.distributed_config --over thunderbolt --backend BACKEND
    --output-hostfile` writes for `macs`, by MLX's own functions on their recorded outputs. Only
    what it asks the Macs over ssh stands in: each Mac's LAN address (`ipconfig getifaddr en0`)
    and the "Enter to continue" prompts."""
    mac_facts = [facts(n, s) for n, s in macs.items()]
    hosts = [cfg.Host(i, n, [], []) for i, n in enumerate(macs)]
    tb_hosts = [tb.thunderbolt_host(m) for m in mac_facts]
    index = {port.uuid: (i, j) for i, h in enumerate(tb_hosts) for j, port in enumerate(h.ports)}
    monkeypatch.setattr(
        cfg,
        "add_ips",
        lambda hs, verbose=False: [h.ips.append(f"10.0.1.{10 + h.rank}") for h in hs],
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("\n" * len(macs)))
    out = tmp_path / f"{backend}.json"
    args = Namespace(
        verbose=False, auto_setup=False, output_hostfile=str(out), env=["MLX_METAL_FAST_SYNCH=1"]
    )
    ips, ssh = cfg.IPConfigurator(hosts, tb_hosts, index), [cfg.SSHInfo(True, False)] * len(macs)
    if backend == "jaccl":
        cfg.configure_jaccl(args, hosts, ips, ssh)
    else:
        ring = cfg.extract_rings(cfg.make_connectivity_matrix(tb_hosts, index))[0]
        cfg.configure_jaccl_ring(args, hosts, ips, ring, ssh)
    return out


@pytest.mark.parametrize("macs", [TWO, THREE], ids=["two", "three"])
@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_mlx_distributed_configs_jaccl_hostfile_is_taken_as_it_writes_it(
    macs, backend, tmp_path, monkeypatch
):
    path = mlx_writes(macs, backend, tmp_path, monkeypatch)
    written = json.loads(path.read_text())
    assert written["backend"] == backend and all(
        len(h["rdma"]) == len(macs) for h in written["hosts"]
    )
    entries, envs = read_hostfile(path)
    assert entries == written["hosts"] and envs == ["MLX_METAL_FAST_SYNCH=1"]
    assert ring_backend(entries, written["backend"]) == backend
    # Without its "backend", the same matrix still says which: a triangle is a full mesh.
    assert ring_backend(entries) == "jaccl"
    hosts = load_hosts(path, 32323, lambda n: n, lambda *_: False)
    assert [h.rdma for h in hosts] == [tuple(h["rdma"]) for h in written["hosts"]]
    assert hosts[0].address == "10.0.1.10"  # rank 0's LAN address: JACCL's coordinator


def test_three_macs_devices_are_their_cabled_ports():
    # The triangle: a.en2-b.en3, b.en2-c.en3, c.en2-a.en3 (tests/data/macos/thunderbolt/README.md).
    entries = [
        {"ssh": "a", "ips": ["10.0.1.10"], "rdma": [None, "rdma_en2", "rdma_en3"]},
        {"ssh": "b", "ips": ["10.0.1.11"], "rdma": ["rdma_en3", None, "rdma_en2"]},
        {"ssh": "c", "ips": ["10.0.1.12"], "rdma": ["rdma_en2", "rdma_en3", None]},
    ]
    assert ring_backend(entries) == "jaccl"
    assert ring_backend(entries, "jaccl-ring") == "jaccl-ring"
    # the hostfile's own choice: TCP, as mlx.launch would
    assert ring_backend(entries, "ring") == "ring"
    four = [
        {
            "ssh": s,
            "ips": [f"10.0.1.{i}"],
            "rdma": [None if j == i or abs(j - i) == 2 else f"rdma_en{j + 2}" for j in range(4)],
        }
        for i, s in enumerate("abcd")
    ]
    assert ring_backend(four) == "jaccl-ring"  # each Mac cabled to its two neighbours only
    # `--backend ring` writes []
    assert ring_backend([{"ssh": "a", "ips": ["10.0.1.1"], "rdma": []}]) == "ring"


def mesh(n: int) -> list[dict]:
    return [
        {
            "ssh": f"mac-{i}",
            "ips": [f"10.0.1.{i}"],
            "rdma": [None if j == i else f"rdma_en{j + 2}" for j in range(n)],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "change, named, says",
    [
        (lambda e: e[1].pop("rdma"), "", 'entry 1 (mac-1) needs "rdma", a list of 3 devices'),
        (lambda e: e[2]["rdma"].pop(), "", 'entry 2 (mac-2) needs "rdma", a list of 3 devices'),
        (
            lambda e: e[0]["rdma"].__setitem__(0, "rdma_en2"),
            "",
            "names RDMA device 'rdma_en2' to itself; its own place",
        ),
        (
            lambda e: e[1]["rdma"].__setitem__(2, ""),
            "",
            "has '' as its RDMA device to rank 2; each is a device name",
        ),
        (
            lambda e: e[1]["rdma"].__setitem__(2, ["rdma_en2", 3]),
            "",
            "to rank 2; each is a device name",
        ),
        (
            lambda e: e[0]["rdma"].__setitem__(1, None),
            "jaccl",
            "is for JACCL's full mesh (every Mac cabled to every other), but no RDMA device is "
            "listed from mac-0 (rank 0) to mac-1 (rank 1); cable them, or use",
        ),
        (
            lambda e: [x["rdma"].__setitem__(j, None) for x in e for j in range(3)],
            "jaccl-ring",
            "is for MLX's 'jaccl-ring' backend but no entry lists its RDMA devices",
        ),
    ],
)
def test_a_jaccl_matrix_mlx_would_refuse_is_refused_with_the_fix(tmp_path, change, named, says):
    entries = mesh(3)
    change(entries)
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps({"backend": named, "hosts": entries}))
    with pytest.raises(ValueError, match="^" + str(path).replace(".", r"\.")) as e:
        read_hostfile(path)
    assert says in str(e.value)


def test_four_macs_cabled_in_a_line_cannot_close_a_jaccl_ring():
    entries = mesh(4)
    for i, j in ((0, 3), (3, 0), (0, 2), (2, 0), (1, 3), (3, 1)):
        entries[i]["rdma"][j] = None
    with pytest.raises(
        ValueError,
        match=r"no RDMA device is listed from mac-0 \(rank 0\) to mac-3 \(rank 3\), .*so the "
        r"ring's neighbours cannot use RDMA; cable "
        r"each Mac to the next",
    ):
        ring_backend(entries)


def test_a_ring_without_a_mac_keeps_rdma_where_the_rest_are_cabled(tmp_path):
    from mlx_ring.launcher import healing
    from mlx_ring.launcher.launch_settings import LaunchSettings

    three = mesh(3)
    assert without_ranks(three, [0, 2]) == [
        {"ssh": "mac-0", "ips": ["10.0.1.0"], "rdma": [None, "rdma_en4"]},
        {"ssh": "mac-2", "ips": ["10.0.1.2"], "rdma": ["rdma_en2", None]},
    ]
    hostfile = tmp_path / "hosts.json"
    s = LaunchSettings(str(hostfile), "127.0.0.1", 0, 32323, 60, 5, 0, tmp_path / "logs", False)
    s.planned.mkdir(parents=True)
    hostfile.write_text(format_hostfile(three, ["MLX_METAL_FAST_SYNCH=1"], "jaccl"))
    reduced = json.loads(healing.without(s, ["mac-1"]).read_text())
    assert reduced["backend"] == "jaccl" and [h["rdma"] for h in reduced["hosts"]] == [
        [None, "rdma_en4"],
        ["rdma_en2", None],
    ]
    # Four Macs in a JACCL ring less one: the two either side of it have no cable, so
    # it heals over TCP.
    four = mesh(4)
    for i, j in ((0, 2), (2, 0), (1, 3), (3, 1)):
        four[i]["rdma"][j] = None
    hostfile.write_text(format_hostfile(four, [], "jaccl-ring"))
    reduced = json.loads(healing.without(s, ["mac-1"]).read_text())
    assert [h["ssh"] for h in reduced] == ["mac-0", "mac-2", "mac-3"] and not any(
        "rdma" in h for h in reduced
    )
    assert ring_backend(reduced) == "ring"


DUMP = """import json, os, sys
devices = os.environ.get("MLX_IBV_DEVICES")
seen = {k: os.environ.get(k) for k in ("MLX_RANK", "MLX_JACCL_COORDINATOR", "MLX_JACCL_RING",
                                      "MLX_HOSTFILE", "MLX_METAL_FAST_SYNCH")}
seen["devices"] = json.loads(open(devices).read()) if devices else None
open(os.path.join(sys.argv[1], seen["MLX_RANK"] + ".json"), "w").write(json.dumps(seen))
"""


def ranks_given(argv: list[str], out: Path) -> list[dict]:
    """Run the real mlx.launch `argv` (its command: DUMP into `out`); what each rank was given."""
    import subprocess

    out.mkdir()
    done = subprocess.run(under_feed(argv), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_our_launch_gives_every_rank_what_mlx_launch_gives_it_on_the_same_hostfile(
    backend, tmp_path, monkeypatch
):
    from mlx_ring.launcher import up
    from mlx_ring.launcher.attempt import mlx_launch_argv
    from mlx_ring.launcher.preflight import Launch, Preflight

    # MLX's hostfile for three Macs, each started on this machine (ssh "127.0.0.1": no ssh).
    written = json.loads(mlx_writes(THREE, backend, tmp_path, monkeypatch).read_text())
    for h in written["hosts"]:
        h["ssh"] = "127.0.0.1"
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(written, indent=4))
    script = tmp_path / "dump.py"
    script.write_text(DUMP)
    port = 40123
    # MLX's way: the hostfile as written, backend and envs from it.
    mlx_way = ranks_given(
        [
            str(Path(sys.executable).parent / "mlx.launch"),
            "--hostfile",
            str(path),
            "--starting-port",
            str(port),
            "--",
            sys.executable,
            str(script),
            str(tmp_path / "mlx"),
        ],
        tmp_path / "mlx",
    )
    # Ours: `up` plans mlx.launch's inputs, the supervisor's command line starts it.
    cfg_ = SimpleNamespace(hostfile=path, host="127.0.0.1", port=8100, tls=None)
    opts = Launch(port, "", None, True, "", {})
    ring = Preflight(
        cfg_,
        opts,
        load_hosts(path, port, lambda n: n),
        tmp_path / "ssh_config",
        {},
        [],
        plan=SimpleNamespace(strategy="memory", sizes=[10, 10, 10]),
        manifest={"id": "m"},
    )
    planned = LaunchDir(tmp_path / "launch")
    up.launch_args(ring, planned.root)
    envs = [x for line in planned.env.read_text().splitlines() if line for x in ("--env", line)]
    argv = mlx_launch_argv(
        planned, port, envs, [sys.executable, str(script), str(tmp_path / "ours")]
    )
    assert argv[1:3] == ["--backend", backend]
    ours = ranks_given(argv, tmp_path / "ours")
    assert len(ours) == 3 and ours == mlx_way
    # rank 0's address, the starting port
    assert ours[0]["MLX_JACCL_COORDINATOR"] == f"10.0.1.10:{port}"
    assert ours[0]["MLX_JACCL_RING"] == ("1" if backend == "jaccl-ring" else None)
    assert (
        ours[0]["devices"] == [h["rdma"] for h in written["hosts"]]
        and ours[0]["MLX_HOSTFILE"] is None
    )
    assert ours[0]["MLX_METAL_FAST_SYNCH"] == "1"  # the hostfile's "envs"


def test_a_tcp_hostfile_still_starts_the_ring_backend(tmp_path):
    from mlx_ring.launcher import up
    from mlx_ring.launcher.attempt import mlx_launch_argv
    from mlx_ring.launcher.preflight import Launch, Preflight

    path = tmp_path / "hosts.json"
    path.write_text(
        json.dumps(
            [{"ssh": "mac-a", "ips": ["192.168.0.5"]}, {"ssh": "mac-b", "ips": ["192.168.0.2"]}]
        )
    )
    ring = Preflight(
        SimpleNamespace(hostfile=path, host="127.0.0.1", port=8100, tls=None),
        Launch(32323, "", None, True, "", {}),
        load_hosts(path, 32323, lambda n: n),
        tmp_path,
        {},
        [],
        plan=SimpleNamespace(strategy="memory", sizes=[15, 15]),
        manifest={"id": "m"},
    )
    planned = LaunchDir(tmp_path / "launch")
    up.launch_args(ring, planned.root)
    assert json.loads(planned.hostfile.read_text()) == [
        {"ssh": "mac-a", "ips": ["192.168.0.5"]},
        {"ssh": "mac-b", "ips": ["192.168.0.2"]},
    ]
    assert mlx_launch_argv(planned, 32323, [], ["x"])[1:3] == ["--backend", "ring"]


def test_thunderbolt_write_refuses_to_turn_a_jaccl_hostfile_into_a_tcp_ring(tmp_path, capsys):
    path = tmp_path / "hosts.json"
    path.write_text(format_hostfile(mesh(3), [], "jaccl"))
    before = path.read_text()
    assert tb.main(["--hostfile", str(path), "--write"]) == 2
    assert (
        "runs the ring over RDMA (JACCL), which --write would turn into a TCP ring; --apply alone"
        in capsys.readouterr().err
    )
    assert path.read_text() == before


def test_a_rank_that_cannot_start_jaccl_names_its_devices_and_the_launcher_says_what_to_check(
    tmp_path,
):
    import os
    import subprocess

    from mlx_ring.launcher.failures import explain

    # This Linux wheel has no JACCL: MLX's own init fails as it would on a Mac
    # whose device cannot open.
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps([[None, "rdma_en2"], ["rdma_en3", None]]))
    env = {
        **os.environ,
        "MLX_IBV_DEVICES": str(devices),
        "MLX_RANK": "1",
        "MLX_JACCL_COORDINATOR": "10.0.1.10:32323",
    }
    p = subprocess.run(
        [sys.executable, "-c", "from mlx_ring.ring.world import init_world; init_world()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert (
        "rank 1 could not join the JACCL ring (its RDMA devices rdma_en3, "
        "coordinator 10.0.1.10:32323): " in p.stderr
    )
    [said] = explain(p.stderr)
    assert said.startswith(
        "rank 1 could not join the JACCL ring (its RDMA devices rdma_en3, coordinator "
        "10.0.1.10:32323; MLX: "
    )
    assert said.endswith(
        "): `./launch.sh check` lists each Mac's RDMA devices; RDMA must be on at both ends of "
        "each cable (`rdma_ctl enable` in macOS Recovery), and every Mac must reach the "
        "coordinator's address"
    )
