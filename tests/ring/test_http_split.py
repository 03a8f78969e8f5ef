"""Rank 0's HTTP in a process of its own, against the real server (one rank): a streamed answer,
a client that leaves frees its row, /metrics and the page answer, the HTTP process holds no MLX,
and killing it ends the server with a named error instead of a hang."""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from serverutil import running_server

EOS_OFF = {"2": -100}  # SmolLM2's end token: forbid it so a request runs as long as we ask

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("httpproc")
    with running_server(tmp, n_ranks=1) as (url, proc):
        yield url, proc, tmp


def http_pid(tmp: Path) -> int:
    log = (tmp / "logs" / "rank0.log").read_text()
    return int(re.findall(r"HTTP process pid (\d+)", log)[-1])


def active(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^mlx_ring_active_sequences (\S+)$", text, re.M).group(1))


def test_a_streamed_answer_comes_through_the_http_process(server):
    url, _, _ = server
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 12,
        "stream": True,
        "logit_bias": EOS_OFF,
        "temperature": 0,
    }
    text, finish = "", None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                text += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
    assert text and finish == "length"


def test_a_stop_string_ends_the_answer_at_it(server):
    url, _, _ = server
    body = {"model": "default", "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 40, "temperature": 0}
    whole = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    first = whole["choices"][0]
    cut = first["text"][len(first["text"]) // 2 :].strip()[:3]
    assert cut, first
    stopped = httpx.post(f"{url}/v1/completions", json=body | {"stop": [cut]}, timeout=60).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and cut not in choice["text"]
    assert first["text"].startswith(choice["text"])
    assert stopped["usage"]["completion_tokens"] < whole["usage"]["completion_tokens"]


def test_choices_stopped_on_the_http_side_leave_the_ring_serving(server):
    # the first choice's row leaves as the second's joins its group: a chained step then has
    # none of the rows it was sampled for
    url, _, _ = server
    body = {"model": "default", "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body | {"n": 2, "stop": ["7"]}, timeout=60)
    assert r.status_code == 200, r.text
    assert [c["finish_reason"] for c in r.json()["choices"]] == ["stop", "stop"]
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200


def test_a_client_that_leaves_frees_its_row(server):
    url, _, _ = server
    body = {
        "model": "default",
        "prompt": "Once upon a time",
        "max_tokens": 4000,
        "stream": True,
        "logit_bias": EOS_OFF,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # held: an iterator dropped at `break` closes the connection
        for i, _ in enumerate(lines):
            if i > 4:
                break
        assert active(url) == 1
    deadline = time.monotonic() + 10
    while active(url) != 0:
        assert time.monotonic() < deadline, "the row was not freed"
        time.sleep(0.1)


def test_metrics_status_and_the_page_answer(server):
    url, _, _ = server
    assert "mlx_ring_active_sequences" in httpx.get(f"{url}/metrics", timeout=10).text
    status = httpx.get(f"{url}/cluster/status", timeout=10)
    assert status.status_code == 200 and len(status.json()["ranks"]) == 1
    page = httpx.get(f"{url}/", timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_the_http_process_is_apart_and_holds_no_mlx(server):
    _, _, tmp = server
    pid, rank0 = http_pid(tmp), int((tmp / "logs" / "rank0.pid").read_text())
    assert pid != rank0
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libmlx" not in maps and "/mlx/core" not in maps
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not [e for e in env if e.startswith(b"MLX_")]
    assert "libmlx" in Path(f"/proc/{rank0}/maps").read_text()


def test_killing_the_http_process_ends_the_server_naming_it(server):
    _, proc, tmp = server
    pid = http_pid(tmp)
    os.kill(pid, signal.SIGKILL)
    proc.wait(60)  # not a hang: rank 0 exits, and mlx.launch with it
    log = (tmp / "logs" / "rank0.log").read_text()
    assert f"the HTTP process (pid {pid}" in log and "exits for a restart" in log
