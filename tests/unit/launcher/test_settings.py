"""The settings the launcher gives every rank: each flag's variable and the environment-only ones,
taken from the parser itself, so a new flag is forwarded without a second list to keep; and the one
table (mlx_ring/settings.py) that the ranks and the launcher both read, each setting documented."""

import re

import pytest

from mlx_ring.config import (
    ENV_ONLY,
    ROOT,
    _parser,
    parse_config,
    setting_names,
    settings_to_forward,
)
from mlx_ring.launcher.launch_settings import read_settings
from mlx_ring.settings import FLAG, LAUNCHER, RANK, SETTINGS, names, read


def test_every_flag_is_a_setting_under_its_variable():
    names = setting_names()
    flags = [
        o
        for a in _parser()._actions
        for o in a.option_strings
        if o.startswith("--") and o not in ("--help", "--prepare")
    ]
    assert sorted(names) == sorted({f[2:].replace("-", "_").upper() for f in flags} | set(ENV_ONLY))
    assert {"MAX_QUEUE", "PROMPT_CACHE_GB", "RING_SOCKET_BUFFER", "API_KEY", "TLS_CERT"} <= set(
        names
    )
    assert "PREPARE" not in names and len(set(names)) == len(names)


def test_forwarded_settings_are_those_set(monkeypatch):
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MAX_QUEUE", "7")
    monkeypatch.setenv("API_KEYS_FILE", "/keys.json")
    monkeypatch.setenv("NOT_A_SETTING", "x")
    cfg, _ = parse_config([])
    assert cfg.max_queue == 7
    forwarded = settings_to_forward()
    assert (
        forwarded["MAX_QUEUE"] == "7"
        and forwarded["API_KEYS_FILE"] == "/keys.json"
        and "NOT_A_SETTING" not in forwarded
    )


def test_served_name_and_aliases(monkeypatch):
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL_ALIASES", " claude-* , gpt-*,,")
    cfg, _ = parse_config(["--served-model-name", "smol"])
    assert (cfg.served_model_name, cfg.model_aliases) == ("smol", ("claude-*", "gpt-*"))
    assert parse_config([])[0].served_model_name is None


def test_the_launcher_and_the_ranks_share_each_default(monkeypatch, tmp_path):
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    cfg, launch = parse_config([])[0], read_settings({}, tmp_path)
    assert (
        (launch.host, launch.port, launch.drain_timeout)
        == (cfg.host, cfg.port, cfg.drain_timeout)
        == ("127.0.0.1", 8100, 30)
    )
    assert (
        ROOT / launch.hostfile == cfg.hostfile and launch.log_dir.name == cfg.log_dir.name == "logs"
    )
    monkeypatch.setenv("PORT", "9100")
    monkeypatch.setenv("DRAIN_TIMEOUT", "5")
    cfg, launch = parse_config([])[0], read_settings(None, tmp_path)
    assert (cfg.port, cfg.drain_timeout) == (launch.port, launch.drain_timeout) == (9100, 5)


def test_the_env_file_under_the_environment(tmp_path):
    (tmp_path / ".env").write_text("RING_PORT=40000\nMAX_RESTARTS=2\nPORT=8200\n")
    # an empty variable counts as unset
    s = read_settings({"PORT": "8300", "MAX_RESTARTS": ""}, tmp_path)
    assert (s.port, s.ring_port, s.max_restarts, s.startup_timeout) == (8300, 40000, 2, 600)


@pytest.mark.parametrize(
    "name, value, said",
    [
        ("PORT", "eighty", "PORT='eighty' must be a number"),
        ("STEP_TIMEOUT", "1m", "STEP_TIMEOUT='1m' must be a number"),
        ("WEIGHTS", "fp8", ("WEIGHTS='fp8' must be one of auto, float32, keep")),
    ],
)
def test_a_bad_value_is_named(name, value, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        read(name, {name: value})


def test_every_setting_a_user_sets_is_documented():
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    set_for_them = {"RING_AWAY", "UV"}  # the launcher and launch.sh set these themselves
    undocumented = [
        n
        for n in names(FLAG, RANK, LAUNCHER)
        if n not in set_for_them and not re.search(rf"\b{n}\b", docs)
    ]
    assert not undocumented, (
        f"document {', '.join(undocumented)} in docs/operations.md's settings table"
    )
