"""hosts.json and MLX's own hostfile: names resolved and ports assigned, malformed files refused
with the entry named, this machine's entry told apart whatever it is called, and an MLX
hostfile's envs on every rank."""

import json

import pytest
from hostsutil import hosts_from

from mlx_ring.hostfile import load_hosts, mlx_hostfile, resolve


def test_hostfile_names_resolved_and_ports_assigned(tmp_path):
    hosts = hosts_from(
        tmp_path,
        [
            {"ssh": "mac-a", "ips": ["192.168.1.10"], "memory_gb": 16},
            {"ssh": "mac-b", "ips": ["mac-b.local"]},
        ],
    )
    assert [(h.ssh, h.address, h.port, h.local) for h in hosts] == [
        ("mac-a", "192.168.1.10", 5000, False),
        ("mac-b", "192.168.1.11", 5001, False),
    ]
    assert hosts[0].keys == {"memory_gb": 16} and hosts[1].named == "mac-b.local"
    assert mlx_hostfile(hosts) == [
        {"ssh": "mac-a", "ips": ["192.168.1.10"]},
        {"ssh": "mac-b", "ips": ["192.168.1.11"]},
    ]
    local = hosts_from(tmp_path, [{"ssh": "localhost", "ips": ["127.0.0.1"]}] * 2)
    assert all(h.local and h.ssh == "127.0.0.1" for h in local)


@pytest.mark.parametrize(
    "entries, says",
    [
        ('{"ssh": "mac-a"}', "must be a non-empty JSON list"),
        ("[]", "must be a non-empty JSON list"),
        ("[{]", "cannot read the hostfile"),
        ([{"ips": ["10.0.0.1"]}], 'entry 0 lacks "ssh"'),
        ([{"ssh": "mac-a", "ips": ["10.0.0.1"]}, {"ssh": "mac-b"}], 'entry 1 (mac-b) lacks "ips"'),
        ([{"ssh": "mac-a", "ip": "10.0.0.1"}], "unknown key(s) ip"),
        ([{"ssh": "mac-a", "ips": ["10.0.0.1"], "control": ""}], "has \"control\" ''"),
        ([{"ssh": "mac-a", "ips": ["10.0.0.1"], "control": ["10.0.0.1"]}], "an IP or a name"),
        (
            [{"ssh": "mac-a", "ips": ["10.0.0.1"]}, {"ssh": "mac-b", "ips": ["10.0.0.1"]}],
            "for two hosts (mac-a and mac-b)",
        ),
        (
            [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "mac-b", "ips": ["10.0.0.2"]}],
            "which other machines cannot reach",
        ),
    ],
)
def test_malformed_hostfiles_are_refused_with_the_entry_named(tmp_path, entries, says):
    with pytest.raises(ValueError) as e:
        hosts_from(tmp_path, entries)
    assert says in str(e.value)


def test_mlx_distributed_configs_hostfile_is_taken_as_mlx_writes_it(tmp_path):
    from mlx._distributed_utils.common import Host, Hostfile

    from mlx_ring.hostfile import read_hostfile

    # What `mlx.distributed_config --backend ring --output-hostfile` writes (its
    # configure_ring does this).
    written = Hostfile(
        [Host(0, "mac-a", ["192.168.0.5"], []), Host(1, "mac-b", ["192.168.0.2"], [])],
        "ring",
        ["MLX_METAL_FAST_SYNCH=1"],
    )
    (tmp_path / "mlx.json").write_text(json.dumps(written.to_json(), indent=4))
    hosts = load_hosts(tmp_path / "mlx.json", 5000, lambda n: n)
    assert [(h.ssh, h.address, h.port) for h in hosts] == [
        ("mac-a", "192.168.0.5", 5000),
        ("mac-b", "192.168.0.2", 5001),
    ]
    # every rank gets them
    assert read_hostfile(tmp_path / "mlx.json")[1] == ["MLX_METAL_FAST_SYNCH=1"]
    assert read_hostfile(tmp_path / "mlx.json")[0] == written.to_json()["hosts"]


@pytest.mark.parametrize(
    "hostfile, says",
    [
        (
            {"backend": "mpi", "envs": [], "hosts": [{"ssh": "mac-a", "ips": ["10.0.0.1"]}]},
            "is for MLX's 'mpi' backend, but this ring runs on MLX's ring, "
            "jaccl, jaccl-ring backends",
        ),
        (
            {"backend": "jaccl", "envs": [], "hosts": [{"ssh": "mac-a", "ips": ["10.0.0.1"]}]},
            "is for MLX's 'jaccl' backend but no entry lists its RDMA devices",
        ),
        (
            {"envs": ["NOEQUALS"], "hosts": [{"ssh": "mac-a", "ips": ["10.0.0.1"]}]},
            '"envs" must be a list of "NAME=value"',
        ),
        (
            {"hosts": [{"ssh": "mac-a", "ips": ["10.0.0.1"]}], "env": ["A=1"]},
            "unknown key(s) env; MLX's hostfile has",
        ),
        ({"backend": "ring", "hosts": []}, "must be a non-empty JSON list"),
    ],
)
def test_an_mlx_hostfile_that_cannot_serve_is_refused(tmp_path, hostfile, says):
    with pytest.raises(ValueError) as e:
        hosts_from(tmp_path, hostfile)
    assert says in str(e.value)


def test_unresolvable_name_is_refused(tmp_path):
    # .invalid never resolves
    entries = [{"ssh": "mac-a", "ips": ["10.0.0.1"]}, {"ssh": "mac-c", "ips": ["mac-c.invalid"]}]
    with pytest.raises(
        ValueError,
        match=r"entry 1 \(mac-c\): cannot resolve 'mac-c.invalid' \(.*\); put its IP address",
    ):
        hosts_from(tmp_path, entries, resolve)


def test_this_machines_entry_is_started_without_ssh_whatever_it_is_called(tmp_path):
    from mlx_ring.hostfile import this_machine

    names = {"studio.local": "192.168.1.10", "mini.local": "192.168.1.11"}

    def lan(name):
        if name[0].isdigit():
            return name
        if name not in names:
            raise ValueError(f"cannot resolve {name!r}")
        return names[name]

    owns = {"192.168.1.10", "169.254.3.1"}.__contains__  # this machine's addresses
    for name, address in [
        ("Studio", "10.9.9.9"),
        ("studio.local", "10.9.9.9"),
        ("studio.lan", "10.9.9.9"),
        ("localhost", "10.9.9.9"),
        ("my-alias", "169.254.3.1"),
        ("192.168.1.10", "10.9.9.9"),
    ]:
        assert this_machine(name, address, lan, owns, hostname="studio.lan"), name
    for name, address in [
        ("mini.local", "192.168.1.11"),
        ("my-alias", "10.9.9.9"),
        ("studio-2", "10.9.9.9"),
    ]:
        assert not this_machine(name, address, lan, owns, hostname="studio.lan"), name
    # For real: this machine's own name gives local ranks, as "127.0.0.1" does.
    import socket

    mine = hosts_from(tmp_path, [{"ssh": socket.gethostname(), "ips": ["127.0.0.1"]}] * 2, resolve)
    assert [h.ssh for h in mine] == ["127.0.0.1", "127.0.0.1"] and all(h.local for h in mine)


def test_an_mlx_hostfiles_envs_reach_every_rank_and_settings_win(tmp_path):
    from types import SimpleNamespace

    from mlx_ring.launcher import up
    from mlx_ring.launcher.preflight import Launch, Preflight

    path = tmp_path / "hosts.json"
    path.write_text(
        json.dumps(
            {
                "backend": "ring",
                "envs": ["MLX_METAL_FAST_SYNCH=1", "MAX_QUEUE=9"],
                "hosts": [{"ssh": "mac-a", "ips": ["192.168.0.5"], "rdma": []}],
            }
        )
    )
    cfg = SimpleNamespace(hostfile=path, host="127.0.0.1", port=8100, tls=None)
    opts = Launch(32323, "", None, True, "", {"MAX_QUEUE": "64"})
    ring = Preflight(
        cfg,
        opts,
        load_hosts(path, 32323, lambda n: n),
        tmp_path / "ssh_config",
        {},
        [],
        plan=SimpleNamespace(strategy="memory", sizes=[30]),
        manifest={"id": "m"},
    )
    up.launch_args(ring, tmp_path / "out")
    env = (tmp_path / "out" / "env").read_text().splitlines()
    assert "MLX_METAL_FAST_SYNCH=1" in env and "MAX_QUEUE=64" in env and "MAX_QUEUE=9" not in env


def test_the_first_entrys_control_address_is_where_workers_reach_rank_0(tmp_path):
    from mlx_ring.hostfile import control_address

    path = tmp_path / "hosts.json"
    entries = [
        {"ssh": "mini-a.local", "ips": ["192.168.0.1"], "control": "192.168.1.10"},
        {"ssh": "mini-b.local", "ips": ["192.168.0.2"]},
    ]
    path.write_text(json.dumps(entries))
    assert control_address(path) == "192.168.1.10"
    path.write_text(json.dumps(entries[::-1]))  # only a worker's entry has one: not rank 0's
    assert control_address(path) is None
    assert control_address(tmp_path / "none.json") is None
