"""mlx_ring.macos_settings on recorded outputs: the Application Firewall's state, switches and
standing of a program, a firewall that drops the ring named with the lines that let it in, power
settings that take a Mac away; and ssh's word for macOS 15's Local Network privacy."""

import pytest
from platformutil import rec

from mlx_ring import macos_settings
from mlx_ring.hosts import ssh


@pytest.mark.parametrize(
    "recording, on",
    [
        ("firewall_enabled.txt", True),
        ("firewall_disabled.txt", False),
        ("firewall_state2.txt", True),
        ("firewall_blocking_all.txt", True),
    ],
)
def test_firewall_state(recording, on):
    assert macos_settings.parse_firewall(rec(recording)) is on


def test_firewall_advice_names_the_environment_python_only_when_on():
    py = "/Users/Shared/mlx-ring/.venv/bin/python"
    text = macos_settings.firewall_advice(True, py)
    assert (
        f"sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add {py} --unblockapp {py}" in text
    )
    assert (
        macos_settings.firewall_advice(False, py) is None
        and macos_settings.firewall_advice(None, py) is None
    )
    assert (
        macos_settings.parse_firewall(
            "Firewall settings cannot be modified from command line on managed Mac computers."
        )
        is None
    )


@pytest.mark.parametrize(
    "recording, value",
    [
        ("firewall_blockall_enabled.txt", True),
        ("firewall_blockall_disabled.txt", False),
        ("firewall_stealth_on.txt", True),
        ("firewall_stealth_off.txt", False),
    ],
)
def test_firewall_switches(recording, value):
    assert macos_settings.parse_switch(rec(recording)) is value
    assert (
        macos_settings.parse_switch(
            "Firewall settings cannot be modified from command line on managed Mac computers."
        )
        is None
    )


@pytest.mark.parametrize(
    "recording, allowed",
    [
        ("appblocked_blocked.txt", False),
        ("appblocked_permitted.txt", True),
        ("appblocked_not_listed.txt", False),
        ("appblocked_not_blocked_path.txt", True),
    ],
)
def test_firewall_standing_of_a_program(recording, allowed):
    assert macos_settings.parse_app_allowed(rec(recording)) is allowed
    assert (
        macos_settings.parse_app_allowed("") is None
        and macos_settings.parse_app_allowed("usage: socketfilterfw ...") is None
    )


def test_a_firewall_that_drops_the_ring_is_named_with_the_lines_that_let_it_in():
    py = "/Users/me/.local/share/uv/python/cpython-3.11.11-macos-aarch64-none/bin/python3.11"
    allow = f"sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add {py} --unblockapp {py}"
    on = macos_settings.parse_firewall(rec("firewall_enabled.txt"))
    blocked = macos_settings.Firewall(
        on, False, False, macos_settings.parse_app_allowed(rec("appblocked_not_listed.txt"))
    )
    assert allow in macos_settings.firewall_blocks(
        blocked, py
    ) and "does not let" in macos_settings.firewall_blocks(blocked, py)
    all_in = macos_settings.Firewall(
        on, macos_settings.parse_switch(rec("firewall_blockall_enabled.txt")), False, True
    )
    said = macos_settings.firewall_blocks(all_in, py)
    assert (
        "blocks all incoming connections" in said and "--setblockall off" in said and allow in said
    )
    # allowed
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(on, False, False, True), py) is None
    )
    # unknown: a warning
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(on, False, False, None), py) is None
    )
    # off
    assert (
        macos_settings.firewall_blocks(macos_settings.Firewall(False, True, True, False), py)
        is None
    )
    assert "stealth mode" in macos_settings.stealth_note(
        macos_settings.Firewall(on, False, True, True)
    )
    assert macos_settings.stealth_note(macos_settings.Firewall(False, False, True, None)) is None


def test_power_settings_that_take_a_mac_away_are_named_with_their_fix():
    desktop = macos_settings.parse_pmset(rec("pmset_g_desktop.txt"))
    assert (
        desktop["sleep"] == "1"
        and desktop["Sleep On Power Button"] == "1"
        and desktop["SleepDisabled"] == "0"
    )
    said = macos_settings.power_advice(desktop)
    assert (
        "goes to sleep after 1 idle minute(s)" in said and "stays off after a power failure" in said
    )
    assert (
        "sudo pmset -a sleep 0 autorestart 1" in said
        and "Prevent automatic sleeping when the display is off" in said
    )
    laptop = macos_settings.parse_pmset(rec("pmset_g_macbook.txt"))
    assert "autorestart" not in laptop and "sudo pmset -a sleep 0 (" in macos_settings.power_advice(
        laptop
    )
    womp = macos_settings.parse_pmset(rec("pmset_g_womp_off.txt"))
    assert womp[
        "displaysleep"
    ] == "10" and "sleep 0 womp 1 autorestart 1" in macos_settings.power_advice(womp)
    ready = dict(desktop, sleep="0", autorestart="1")
    # Linux: nothing read
    assert macos_settings.power_advice(ready) is None and macos_settings.power_advice({}) is None
    # pmset disablesleep 1
    assert macos_settings.power_advice(dict(desktop, SleepDisabled="1", autorestart="1")) is None


def test_no_route_on_macos_15_names_local_network_privacy():
    err = "ssh: connect to host 169.254.10.2 port 22: No route to host"
    text = ssh.explain("mac-b", err, system="Darwin", mac_version="15.1")
    assert "is it on" in text and "Privacy & Security > Local Network" in text and "\n" not in text
    assert "Local Network" not in ssh.explain("mac-b", err, system="Darwin", mac_version="14.6.1")
    assert "Local Network" not in ssh.explain("mac-b", err, system="Linux", mac_version="")
    assert "Local Network" not in ssh.explain(
        "mac-b",
        "ssh: connect to host x port 22: Connection timed out",
        system="Darwin",
        mac_version="15.1",
    )
