"""API keys and their limits. `API_KEY` is one key without limits; `API_KEYS_FILE` names a JSON list
of keys, each with a name (what logs and errors show: a key itself is never logged) and optional
requests-per-minute (`rpm`) and tokens-per-minute (`tpm`) limits, kept over a sliding minute.

Tokens are counted as OpenAI does: a request reserves its prompt plus `max_tokens` when it is let
in, and what it really used replaces the reservation when it ends.
"""

import hmac
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from mlx_ring.config import json_objects

WINDOW = 60.0
EXAMPLE = (
    '[{"name": "alice", "key": "sk-alice-...", "rpm": 60, "tpm": 100000}, {"name": "ci", '
    '"key": "sk-ci-..."}]'
)


@dataclass(eq=False)
class Key:
    name: str
    secret: bytes  # "Bearer <key>", as the header carries it
    rpm: int | None = None
    tpm: int | None = None
    # [time, 1] for each of the last minute's requests
    requests: deque = field(default_factory=deque)
    # [time, tokens] for each of the last minute's requests
    tokens: deque = field(default_factory=deque)


def load_keys(api_key: str | None, keys_file: Path | None) -> list[Key]:
    """The keys the server accepts (none: no authentication); ValueError naming what is wrong."""
    keys = [Key("API_KEY", f"Bearer {api_key}".encode())] if api_key else []
    if keys_file is None:
        return keys
    rows = json_objects(keys_file, "API_KEYS_FILE", EXAMPLE, ("name", "key", "rpm", "tpm"))
    for i, r in enumerate(rows):
        where = f"API_KEYS_FILE entry {i}"
        if not isinstance(r.get("key"), str) or len(r["key"]) < 8:
            raise ValueError(f'{where} needs "key", a string of at least 8 characters')
        for limit in ("rpm", "tpm"):
            if limit in r and (
                not isinstance(r[limit], int) or isinstance(r[limit], bool) or r[limit] < 1
            ):
                raise ValueError(
                    (
                        f"{where}: {limit} must be a positive whole number (per "
                        f"minute), got {r[limit]!r}"
                    )
                )
        keys.append(
            Key(
                str(r.get("name") or f"key-{i}"),
                f"Bearer {r['key']}".encode(),
                r.get("rpm"),
                r.get("tpm"),
            )
        )
    if len({k.secret for k in keys}) != len(keys) or len({k.name for k in keys}) != len(keys):
        raise ValueError(f"API_KEYS_FILE {keys_file}: every key and every name must be different")
    return keys


def find(keys: list[Key], header: bytes) -> Key | None:
    """The key an Authorization header names, comparing against every key in constant time."""
    found = None
    for k in keys:
        if hmac.compare_digest(header, k.secret):
            found = k
    return found


class RateLimited(Exception):
    def __init__(self, message: str, kind: str, retry_after: float):
        super().__init__(message)
        self.kind, self.retry_after = kind, max(1, int(retry_after + 0.999))


def _trim(window: deque, now: float) -> None:
    while window and now - window[0][0] >= WINDOW:
        window.popleft()


def count_request(key: Key, now: float | None = None) -> None:
    """One more request for `key`, or RateLimited if its minute is full."""
    now = time.monotonic() if now is None else now
    _trim(key.requests, now)
    if key.rpm is not None and len(key.requests) >= key.rpm:
        raise RateLimited(
            f"rate limit reached for key {key.name!r}: {key.rpm} requests per minute; retry later",
            "requests",
            key.requests[0][0] + WINDOW - now,
        )
    key.requests.append([now, 1])


def reserve_tokens(key: Key, tokens: int, now: float | None = None) -> list:
    """Reserve `tokens` for a request (RateLimited if the minute cannot hold them); returns the
    reservation, which `settle` corrects to what the request used."""
    now = time.monotonic() if now is None else now
    _trim(key.tokens, now)
    if key.tpm is not None:
        if tokens > key.tpm:
            raise RateLimited(
                f"this request may use {tokens} tokens (prompt + max_tokens), over the {key.tpm} "
                f"tokens per minute of key {key.name!r}; lower max_tokens",
                "tokens",
                WINDOW,
            )
        used, wait = sum(t for _, t in key.tokens), 0.0
        for at, t in key.tokens:  # wait until enough of the oldest reservations leave the window
            if used + tokens <= key.tpm:
                break
            used, wait = used - t, at + WINDOW - now
        if used + tokens > key.tpm or wait > 0:
            raise RateLimited(
                f"rate limit reached for key {key.name!r}: {key.tpm} tokens "
                "per minute; retry later",
                "tokens",
                wait,
            )
    entry = [now, tokens]
    key.tokens.append(entry)
    return entry


def settle(reservation: list, used: int) -> None:
    reservation[1] = used
