"""The settings the launcher gives every rank: each flag's variable and the environment-only ones,
taken from the parser itself, so a new flag is forwarded without a second list to keep."""

from mlx_ring.config import ENV_ONLY, _parser, parse_config, setting_names, settings_to_forward


def test_every_flag_is_a_setting_under_its_variable():
    names = setting_names()
    flags = [o for a in _parser()._actions for o in a.option_strings if o.startswith("--") and o not in ("--help", "--prepare")]
    assert sorted(names) == sorted({f[2:].replace("-", "_").upper() for f in flags} | set(ENV_ONLY))
    assert {"MAX_QUEUE", "PROMPT_CACHE_GB", "RING_SOCKET_BUFFER", "API_KEY", "TLS_CERT"} <= set(names)
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
    assert forwarded["MAX_QUEUE"] == "7" and forwarded["API_KEYS_FILE"] == "/keys.json" and "NOT_A_SETTING" not in forwarded


def test_served_name_and_aliases(monkeypatch):
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODEL_ALIASES", " claude-* , gpt-*,,")
    cfg, _ = parse_config(["--served-model-name", "smol"])
    assert (cfg.served_model_name, cfg.model_aliases) == ("smol", ("claude-*", "gpt-*"))
    assert parse_config([])[0].served_model_name is None
