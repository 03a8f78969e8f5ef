"""HTTPS and API keys with per-minute limits on one ring started by the real launcher (`launch.sh`,
2 ranks): the openai client over TLS, plain HTTP and an untrusted certificate refused, each key's
requests and tokens per minute, and no key in any log."""

import json
import ssl
import subprocess

import httpx
import openai
import pytest
from test_resilience import Launcher


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, default_model):
    """One ring behind HTTPS and API keys with per-minute limits (alice: 2 requests, bob: 200
    tokens, carol: none), for the tests of each."""
    tmp = tmp_path_factory.mktemp("guarded")
    cert, key, keys = tmp / "cert.pem", tmp / "key.pem", tmp / "keys.json"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    keys.write_text(
        json.dumps(
            [
                {"name": "alice", "key": "sk-alice-secret-1", "rpm": 2},
                {"name": "bob", "key": "sk-bob-secret-22", "tpm": 200},
                {"name": "carol", "key": "sk-carol-secret-333"},
            ]
        )
    )
    ln = Launcher(tmp, TLS_CERT=cert, TLS_KEY=key, API_KEYS_FILE=keys)
    r = ln.sh("start")
    assert r.returncode == 0, r.stdout + r.stderr
    ln.url, ln.cert = f"https://127.0.0.1:{ln.port}", cert
    yield ln
    ln.sh("stop", timeout=120)


def https_client(ln: Launcher, key: str) -> openai.OpenAI:
    """The openai client over HTTPS, trusting the ring's certificate."""
    return openai.OpenAI(
        base_url=f"{ln.url}/v1",
        api_key=key,
        max_retries=0,
        timeout=60,
        http_client=httpx.Client(verify=ssl.create_default_context(cafile=ln.cert)),
    )


def test_tls_serves_https_to_the_openai_client(guarded):
    ln = guarded
    with https_client(ln, "sk-carol-secret-333") as client:
        r = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
        )
    assert r.choices[0].message.content and r.usage.completion_tokens == 4
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the TLS port
        httpx.get(f"http://127.0.0.1:{ln.port}/health", timeout=5).raise_for_status()
    with pytest.raises(httpx.HTTPError):  # nor is the certificate trusted without being given
        httpx.get(f"{ln.url}/health", timeout=5)
    st = ln.sh("status")
    assert st.returncode == 0 and "[15, 30)" in st.stdout, st.stderr


def test_api_keys_with_per_minute_limits(guarded):
    ln = guarded
    hi = [{"role": "user", "content": "Hi"}]

    def ask(key, max_tokens=4):
        with https_client(ln, key) as c:
            return c.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=hi, max_tokens=max_tokens
            )

    with pytest.raises(openai.AuthenticationError):
        ask("sk-nobody-000")
    ask("sk-alice-secret-1")
    ask("sk-alice-secret-1")
    with pytest.raises(openai.RateLimitError) as e:  # a third request in the minute
        ask("sk-alice-secret-1")
    assert e.value.response.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
    err = e.value.response.json()["error"]
    assert (
        err["code"] == "rate_limit_exceeded"
        and err["type"] == "requests"
        and "'alice'" in err["message"]
    )
    # 31 prompt tokens + 300 never fit 200
    with pytest.raises(openai.RateLimitError, match="lower max_tokens"):
        ask("sk-bob-secret-22", max_tokens=300)
    r = ask("sk-bob-secret-22", max_tokens=100)  # reserves 131, settles at what it used
    used = r.usage.total_tokens
    if used + 131 > 200:  # a second such reservation does not fit the minute
        with pytest.raises(openai.RateLimitError, match="200 tokens per minute"):
            ask("sk-bob-secret-22", max_tokens=100)
    ask("sk-bob-secret-22", max_tokens=200 - used - 31)  # what is left does
    logs = "".join(p.read_text(errors="replace") for p in (ln.tmp / "logs").rglob("*.log"))
    assert "rank 0" in logs and "sk-alice-secret-1" not in logs and "sk-bob-secret-22" not in logs
    assert "sk-carol-secret-333" not in logs
