"""API keys: the file's checks, constant-time lookup, and the per-minute
request and token windows."""

import json

import pytest

from mlx_ring.api.keys import RateLimited, count_request, find, load_keys, reserve_tokens, settle


def keys_from(tmp_path, rows, api_key=None):
    path = tmp_path / "keys.json"
    path.write_text(rows if isinstance(rows, str) else json.dumps(rows))
    return load_keys(api_key, path)


def test_keys_file_and_lookup(tmp_path):
    keys = keys_from(
        tmp_path,
        [{"name": "alice", "key": "sk-alice-1", "rpm": 2}, {"key": "sk-bob-22", "tpm": 100}],
        "single-key",
    )
    assert [(k.name, k.rpm, k.tpm) for k in keys] == [
        ("API_KEY", None, None),
        ("alice", 2, None),
        ("key-1", None, 100),
    ]
    assert (
        find(keys, b"Bearer sk-alice-1").name == "alice"
        and find(keys, b"Bearer single-key").name == "API_KEY"
    )
    assert find(keys, b"Bearer sk-alice-") is None and find(keys, b"") is None
    assert load_keys(None, None) == []


@pytest.mark.parametrize(
    "rows, says",
    [
        ("{", "cannot read API_KEYS_FILE"),
        ({"key": "sk-alice-1"}, "non-empty JSON list"),
        ([{"key": "short"}], "at least 8 characters"),
        ([{"key": "sk-alice-1", "rpm": 0}], "rpm must be a positive whole number"),
        ([{"key": "sk-alice-1", "limit": 3}], "unknown key(s) limit"),
        (
            [{"key": "sk-alice-1"}, {"key": "sk-alice-1"}],
            "every key and every name must be different",
        ),
    ],
)
def test_bad_keys_files_are_refused(tmp_path, rows, says):
    with pytest.raises(ValueError) as e:
        keys_from(tmp_path, rows)
    assert says in str(e.value)


def test_requests_per_minute_slide(tmp_path):
    (key,) = keys_from(tmp_path, [{"name": "alice", "key": "sk-alice-1", "rpm": 2}])
    count_request(key, now=0.0)
    count_request(key, now=10.0)
    with pytest.raises(RateLimited) as e:
        count_request(key, now=30.0)
    assert (
        e.value.kind == "requests"
        and e.value.retry_after == 30
        and "alice" in str(e.value)
        and "sk-" not in str(e.value)
    )
    count_request(key, now=60.0)  # the first left the window


def test_tokens_per_minute_reserve_then_settle(tmp_path):
    (key,) = keys_from(tmp_path, [{"name": "bob", "key": "sk-bob-22", "tpm": 100}])
    with pytest.raises(RateLimited, match="lower max_tokens"):
        reserve_tokens(key, 101, now=0.0)  # can never fit
    first = reserve_tokens(key, 80, now=0.0)  # prompt + max_tokens
    with pytest.raises(RateLimited) as e:
        reserve_tokens(key, 30, now=5.0)
    assert e.value.kind == "tokens" and e.value.retry_after == 55
    settle(first, 20)  # it used only 20
    reserve_tokens(key, 30, now=6.0)
    reserve_tokens(key, 50, now=7.0)
    with pytest.raises(RateLimited):
        reserve_tokens(key, 1, now=8.0)
    reserve_tokens(key, 100, now=67.5)  # a minute later the window is empty again
