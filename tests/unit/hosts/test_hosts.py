"""The hosts package's pure parts: hosts.json checks, ssh's failures as sentences, the facts a host
reports, weight pieces that rebuild the model exactly, and the ranks' agreement check."""

import json
import os

import mlx.core as mx
import pytest
from ringutil import make_tiny_model

from mlx_ring.hostfile import load_hosts, mlx_hostfile, resolve
from mlx_ring.hosts import ssh
from mlx_ring.hosts.facts import parse
from mlx_ring.hosts.identity import disagreement
from mlx_ring.hosts.weights import build_manifest, manifest, missing_pieces, piece_bytes, pieces_for


def hosts_from(tmp_path, entries, resolver=lambda n: {"mac-b.local": "192.168.1.11"}.get(n, n)):
    path = tmp_path / "hosts.json"
    path.write_text(entries if isinstance(entries, str) else json.dumps(entries))
    return load_hosts(path, 5000, resolver)


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

    # What `mlx.distributed_config --backend ring --output-hostfile` writes (its configure_ring does
    # this).
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


@pytest.mark.parametrize(
    "stderr, says",
    [
        ("ssh: connect to host 10.0.0.9 port 22: Connection refused", "Remote Login"),
        (
            "ssh: connect to host 10.0.0.9 port 22: Connection timed out",
            "is it on, awake and on this network? (a Mac asleep",
        ),
        ("root@10.0.0.9: Permission denied (publickey).", "ssh-copy-id mac-b"),
        ("ssh: Could not resolve hostname mac-b: Name or service not known", "use its IP address"),
    ],
)
def test_ssh_failures_become_one_sentence_naming_the_host(stderr, says):
    text = ssh.explain("mac-b", stderr)
    assert text.startswith("cannot reach mac-b over ssh (") and says in text and "\n" not in text


def test_facts_parse():
    out = (
        "hostname=mac-b\nsystem=Darwin arm64\nmeminfo<<\nMemTotal: 16777216 kB\nMemAvailable: "
        "8388608 kB\n>>\nip_addr<<\n1: lo    inet 127.0.0.1/8 scope host lo\n2: en0    inet "
        "10.0.0.2/24 brd 10.0.0.255 scope global "
        "en0\n>>\nuv=/Users/me/.local/bin/uv\ncheckout=yes\nversions=0.32.4 0.32.2\nsums<<\nabc  "
        "server.py\ndef  mlx_ring/a b.py\n>>\nblobs=aa.safetensors bb.safetensors\nhosted=m1 ff\n"
    )
    f = parse("mac-b", out)
    assert (f.hostname, f.system, f.memory_gb, f.free_gb, f.addresses) == (
        "mac-b",
        "Darwin arm64",
        16.0,
        8.0,
        ("10.0.0.2", "127.0.0.1"),
    )
    assert (
        f.checkout
        and f.versions == "0.32.4 0.32.2"
        and f.sums == {"server.py": "abc", "mlx_ring/a b.py": "def"}
    )
    assert (
        f.blobs == {"aa.safetensors", "bb.safetensors"}
        and f.hosted == {"m1": "ff"}
        and not f.openblas
    )


def test_weight_pieces_rebuild_every_tensor_exactly(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama", n_layers=3)
    weights = mx.load(str(folder / "model.safetensors"))
    w, scales, biases = mx.quantize(
        weights["model.layers.1.mlp.up_proj.weight"], group_size=32, bits=4
    )
    weights |= {
        "model.layers.1.mlp.up_proj.weight": w,
        "model.layers.1.mlp.up_proj.scales": scales.astype(mx.bfloat16),
        # uint32, bfloat16, float16 beside float32
        "model.layers.1.mlp.up_proj.biases": biases.astype(mx.float16),
    }
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    m = build_manifest(folder)
    assert sorted(m["pieces"]) == ["ends", "layer-00000", "layer-00001", "layer-00002"]
    original = mx.load(str(next(folder.glob("model*.safetensors"))))
    rebuilt = {}
    for name, piece in m["pieces"].items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(b"".join(piece_bytes(folder, piece)))
        assert path.stat().st_size == piece["size"]
        rebuilt |= mx.load(str(path))
    assert rebuilt.keys() == original.keys()
    assert all(
        rebuilt[k].dtype == original[k].dtype and mx.array_equal(rebuilt[k], original[k]).item()
        for k in original
    )
    assert sum(p["size"] for p in m["pieces"].values()) == pytest.approx(
        sum(v.nbytes for v in original.values()), rel=0.01
    )
    assert manifest(folder, tmp_path / "cache") == m  # cached, and the same
    assert pieces_for(range(1, 3), ends=False) == ["layer-00001", "layer-00002"]
    assert missing_pieces(folder, ["ends"]) == []  # an ordinary folder holds every piece


def test_a_different_model_gets_a_different_id(tmp_path):
    a = build_manifest(make_tiny_model(tmp_path / "a", "llama", n_layers=2, seed=1))
    b = build_manifest(make_tiny_model(tmp_path / "b", "llama", n_layers=2, seed=2))
    assert a["id"] != b["id"] and a["pieces"]["ends"]["size"] == b["pieces"]["ends"]["size"]


def test_disagreement_names_the_host_that_differs():
    row = {"host": "mac-a", "model": "m1", "code": "c1", "mlx": "0.32.4", "mlx-lm": "0.32.2"}
    assert disagreement([row, dict(row, host="mac-b")]) is None
    text = disagreement([row, dict(row, host="mac-b"), dict(row, host="mac-c", model="m2")])
    assert (
        text.startswith("rank 2 on host mac-c has model m2 but rank 0 on mac-a has m1;")
        and "set MODEL once" in text
    )
    assert "rank 1 on host mac-b has mlx 0.31.0" in disagreement(
        [row, dict(row, host="mac-b", mlx="0.31.0")]
    )


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


def test_weights_take_the_ring_link_when_ssh_reaches_the_host_another_way(tmp_path):
    user = tmp_path / "user_config"
    user.write_text("Host mini\n  HostName 192.168.1.20\n  User alice\n")
    conf = ssh.write_config(tmp_path / "ssh_config", str(user))
    lan = {"192.168.1.20": "192.168.1.20", "169.254.7.2": "169.254.7.2"}.get
    assert ssh.reached_at(conf, "mini") == "192.168.1.20"  # real `ssh -G` over the user's config
    assert ssh.bulk_route(conf, "mini", "192.168.1.20", lan) is None  # one link: nothing to choose
    # Wi-Fi name, Thunderbolt ring
    assert ssh.bulk_route(conf, "mini", "169.254.7.2", lan) == "169.254.7.2"
    argv = ssh.argv(conf, "mini", "true", (), via="169.254.7.2")
    assert argv[:7] == [
        "ssh",
        "-F",
        str(conf),
        "-o",
        "HostName=169.254.7.2",
        "-o",
        "HostKeyAlias=mini",
    ]
    assert argv[7] == "mini"  # still the user's entry: user alice, the key known for mini


def test_install_locations_a_mac_closes_to_ssh_are_named():
    from mlx_ring.hosts.provision import closed_to_ssh_on_macos, location_advice

    for closed in (
        "/Users/alice/Documents/mlx-ring",
        "/Users/bob/Desktop/x",
        "/Users/bob/Downloads/mlx-ring-main",
    ):
        assert closed_to_ssh_on_macos(closed), closed
    for fine in (
        "/Users/Shared/mlx-ring",
        "/Users/alice/src/mlx-ring",
        "/opt/mlx-ring",
        "/home/alice/Documents/x",
    ):
        assert not closed_to_ssh_on_macos(fine), fine
    assert "/Users/Shared/mlx-ring" in location_advice("/Users/alice/Documents/mlx-ring")


def test_check_warns_of_a_macs_firewall_and_of_misrouting_ring_addresses(tmp_path):
    from mlx_ring.hosts.facts import Facts
    from mlx_ring.launcher.preflight import Preflight, warnings

    mac = Facts(
        "mini-2.local",
        system="Darwin arm64",
        firewall=True,
        python="/Users/Shared/py/bin/python3.11",
    )
    ring = Preflight(
        None,
        None,
        hosts_from(
            tmp_path,
            [
                {"ssh": "mini-1", "ips": ["192.168.1.10"]},
                {"ssh": "mini-2.local", "ips": ["169.254.7.2"]},
            ],
        ),
        None,
        {"mini-1": Facts("mini-1", system="Darwin arm64", firewall=False), "mini-2.local": mac},
        [],
    )
    said = warnings(ring)
    assert len(said) == 2 and "169.254.7.2" in said[0]
    assert (
        said[1].startswith("mini-2.local: the macOS Application Firewall is on")
        and "--add /Users/Shared/py/bin/python3.11 --unblockapp /Users/Shared/py/bin/python3.11"
        in said[1]
    )


def test_a_firewall_that_drops_the_ring_stops_it_and_a_mac_that_sleeps_is_warned_of(tmp_path):
    from mlx_ring.hosts.facts import Facts
    from mlx_ring.launcher.preflight import Preflight, firewall_problems, warnings
    from mlx_ring.macos_settings import Firewall, parse_pmset

    mac_dir = os.path.join(os.path.dirname(__file__), "..", "..", "data", "macos")
    py = "/Users/me/.local/share/uv/python/cpython-3.11.11-macos-aarch64-none/bin/python3.11"
    blocked = Facts(
        "mini-2.local",
        system="Darwin arm64",
        firewall=True,
        python=py,
        fw=Firewall(True, False, False, False),
        power=parse_pmset(open(os.path.join(mac_dir, "pmset_g_desktop.txt")).read()),
    )
    here = Facts(
        "127.0.0.1",
        system="Darwin arm64",
        firewall=True,
        python=py,
        fw=Firewall(True, False, True, True),
    )
    entries = [
        {"ssh": "127.0.0.1", "ips": ["192.168.1.10"]},
        {"ssh": "mini-2.local", "ips": ["192.168.1.11"]},
    ]
    ring = Preflight(
        None,
        None,
        hosts_from(tmp_path, entries),
        None,
        {"127.0.0.1": here, "mini-2.local": blocked},
        [],
    )
    firewall_problems(ring)
    assert len(ring.problems) == 1 and ring.problems[0].startswith(
        f"mini-2.local: the macOS Application Firewall does not let {py} accept "
        "incoming connections"
    )
    assert f"--add {py} --unblockapp {py}" in ring.problems[0]
    # the refusal is not repeated as a warning; stealth mode and sleep are warned of
    said = warnings(ring)
    assert not any("does not let" in w for w in said)
    assert any(
        w.startswith("this machine: the macOS Application Firewall is in stealth mode")
        for w in said
    )
    assert any(
        w.startswith("mini-2.local: it goes to sleep after 1 idle minute(s)")
        and "sudo pmset -a sleep 0" in w
        for w in said
    ), said
    # One machine: the ranks talk over loopback, which the firewall lets through.
    alone = Preflight(
        None,
        None,
        hosts_from(tmp_path, [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2),
        None,
        {
            "127.0.0.1": Facts(
                "127.0.0.1", firewall=True, python=py, fw=Firewall(True, True, True, False)
            )
        },
        [],
    )
    firewall_problems(alone)
    assert alone.problems == [] and warnings(alone) == []


def test_a_rank_finds_its_own_slice_whatever_else_the_cache_holds(tmp_path):
    from mlx_ring.hosts.weights import MANIFEST, find_slice, slice_folder

    def hosted(needed, model="m1"):
        folder = tmp_path / "hosted" / slice_folder(model, needed)
        folder.mkdir(parents=True)
        (folder / MANIFEST).write_text(json.dumps({"id": model, "present": needed}))
        return folder

    stale = hosted(pieces_for(range(12, 30), False))  # another rank's slice, once held here
    # two ranks on one host
    both = hosted(pieces_for(range(0, 12), True) + pieces_for(range(12, 20), False))
    hosted(pieces_for(range(0, 30), True), model="m2")  # another model
    assert (
        slice_folder("m1", ["a", "b"])
        == slice_folder("m1", ["b", "a"])
        != slice_folder("m1", ["a"])
    )
    assert find_slice(tmp_path, "m1", pieces_for(range(0, 12), True)) == both
    assert find_slice(tmp_path, "m1", pieces_for(range(20, 30), False)) == stale
    assert (
        find_slice(tmp_path, "m1", pieces_for(range(0, 4), True) + pieces_for(range(25, 30), False))
        is None
    )
    # none holds it all: resolve it
    assert find_slice(tmp_path, "m1", pieces_for(range(0, 30), True)) is None


def test_a_rank_leaves_no_temporary_file_of_mlx_launch_behind(tmp_path, monkeypatch):
    import subprocess
    import sys

    from mlx_ring.ring.leftovers import drop_hostfile, note, own_files, sweep

    # As mlx.launch makes them: a pid file holding the rank's pid, and the ring's hostfile.
    pidfile, hostfile, other = tmp_path / "tmp.Ab12", tmp_path / "tmp.Cd34", tmp_path / "tmp.Ef56"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    pidfile.write_text(f"{dead}\n")
    hostfile.write_text('[["10.0.0.1:5000"]]')
    other.write_text("1\n")  # someone else's
    assert own_files(int(dead), str(hostfile)) == [hostfile, pidfile]
    notes = tmp_path / "tempfiles"
    notes.mkdir()
    (notes / dead).write_text(f"{pidfile}\n{hostfile}\n")  # a rank that died as it started
    mine_pid, mine_host = tmp_path / "tmp.Gh78", tmp_path / "tmp.Ij90"
    mine_pid.write_text(f"{os.getpid()}\n")
    mine_host.write_text('[["10.0.0.2:5000"]]')
    monkeypatch.setenv("MLX_HOSTFILE", str(mine_host))
    note(notes)  # a new rank: the gone one's files go, its own are noted
    assert (
        not pidfile.exists()
        and not hostfile.exists()
        and other.exists()
        and not (notes / dead).exists()
    )
    assert mine_host.exists() and mine_pid.exists()
    drop_hostfile()  # read at init
    assert not mine_host.exists()
    # while this rank lives its pid file stays: mlx.launch stops the rank with it
    assert sweep(notes) == []
    (notes / dead).write_text((notes / str(os.getpid())).read_text())  # as if it were gone
    assert sweep(notes) == [mine_pid, notes / dead] and other.exists()


def test_a_stale_rank_of_an_earlier_ring_is_killed_before_a_new_one_starts(tmp_path):
    import subprocess
    import sys

    from mlx_ring.ring.leftovers import sweep

    notes = tmp_path / "tempfiles"
    notes.mkdir()
    # a rank's command line
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "server.py"])
    # a reused pid: not ours
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for p in (stale, other):
            (tmp_path / f"tmp.{p.pid}").write_text(f"{p.pid}\n")
            (notes / str(p.pid)).write_text(f"{tmp_path / f'tmp.{p.pid}'}\n")
        assert sweep(notes) == []  # after a run: both alive, nothing removed
        removed = sweep(notes, kill=True)  # before a new ring
        assert stale.wait(5) == -9 and other.poll() is None
        assert removed == [tmp_path / f"tmp.{stale.pid}", notes / str(stale.pid)]
    finally:
        stale.kill()
        other.kill()


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


def test_the_supervisor_says_again_what_it_waits_for_while_a_host_stays_away(tmp_path, caplog):
    import logging
    import threading
    import time

    from ringutil import free_port

    from mlx_ring.launcher.waiting import wait_for

    # A host whose ssh port refuses at once: real ssh, tried again and again.
    user = tmp_path / "user_config"
    user.write_text(f"Host mini-away\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    conf = ssh.write_config(tmp_path / "ssh_config", str(user))
    stopping = threading.Event()
    why = "cannot reach mini-away over ssh (Connection refused)"
    waiter = threading.Thread(
        target=wait_for,
        args=(conf, ["mini-away"], why, stopping),
        daemon=True,
        kwargs={"remind_s": 0, "poll_s": 0.05},
    )
    with caplog.at_level(logging.INFO, logger="launcher"):
        waiter.start()
        deadline = time.monotonic() + 60
        while (
            sum("still waiting for mini-away" in r.message for r in caplog.records) < 2
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert waiter.is_alive()  # it waits on while the host stays away
        stopping.set()
        waiter.join(30)
    said = [r.message for r in caplog.records if "still waiting" in r.message]
    assert (
        len(said) >= 2
        and why in said[0]
        and "asleep" in said[0]
        and "sudo pmset -a sleep 0" in said[0]
    )
    assert not waiter.is_alive()
    gave_up = threading.Event()  # FAILOVER_AFTER: the caller's own reason to stop waiting
    wait_for(conf, ["mini-away"], why, threading.Event(), give_up=lambda: gave_up.set() or True)
    assert gave_up.is_set()
