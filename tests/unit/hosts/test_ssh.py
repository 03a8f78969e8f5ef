"""ssh to the hosts: its failures as one sentence naming the host, the ring link weights take when
ssh reaches a host another way, the folders a Mac closes to ssh, and the supervisor's reminders
while a host stays away (real ssh, a port that refuses)."""

import pytest

from mlx_ring.hosts import ssh


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
