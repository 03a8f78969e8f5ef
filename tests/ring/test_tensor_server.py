"""The server in tensor mode, started as a user starts it (`PARALLEL=tensor ./launch.sh start`, 3
ranks: the default model's 9 heads and 3 KV heads divide among them): the API's features on it,
the mode shown where the plan is, and a rank killed mid-stream."""

import json
import os
import re
import signal
import time

import httpx
import openai
import pytest
from ringutil import free_port, write_hostfile
from test_resilience import Launcher, long_stream, restarts

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tensor_ring(tmp_path_factory, default_model):
    ln = Launcher(
        tmp_path_factory.mktemp("tensor"),
        PARALLEL="tensor",
        STEP_TIMEOUT=30,
        MAX_RESTARTS=10,
        DRAFT_TOKENS=4,
    )
    ln.env |= {
        "HOSTFILE": str(write_hostfile(ln.tmp / "hosts3.json", 3)),
        "RING_PORT": str(free_port(4)),
    }
    r = ln.sh("start")
    assert r.returncode == 0, r.stdout + r.stderr
    yield ln
    ln.sh("stop", timeout=120)


def test_tensor_mode_serves_logprobs_grammars_and_shows_its_mode(tensor_ring):
    ln = tensor_ring
    status = httpx.get(f"{ln.url}/cluster/status", timeout=30).json()
    assert status["plan"]["mode"] == "tensor", status["plan"]
    assert [r["layers"] for r in status["ranks"]] == [[0, 30]] * 3, status["ranks"]
    assert "tensor mode" in ln.sh("status").stdout
    # 3 ranks on 2 shared cores: each token's 60 all_sums take their turns
    client = ln.client(timeout=600)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        temperature=0,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(
        len(t.top_logprobs) == 3 for t in content
    ), r
    assert all(t.logprob <= 0 for t in content)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    assert r.choices[0].finish_reason == "stop", r
    person = json.loads(r.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int), person


def test_killed_rank_in_tensor_mode_errors_fast_then_ring_restarts(tensor_ring):
    """Every rank is in each step's all_sums: the others see the lost connection at once, well
    within STEP_TIMEOUT (30 s here, for this shared 2-core box's slow prompt steps)."""
    ln, before = tensor_ring, restarts(tensor_ring)
    stream = long_stream(ln.client())
    next(stream), next(stream)  # generating
    os.kill(ln.pid("rank1"), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError, match="ring failure"):
        for _ in stream:
            pass
    assert time.monotonic() - t0 < 10
    ln.wait_healthy(within=300)  # a restart loads and warms 3 ranks again on 2 shared cores
    r = ln.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert restarts(ln) == before + 1
    assert httpx.get(f"{ln.url}/cluster/status", timeout=30).json()["plan"]["mode"] == "tensor"


def test_stopped_rank_in_tensor_mode_is_named_then_ring_restarts(tensor_ring):
    """A stopped rank closes nothing: its beats on the control link stop, and rank 0 names it
    well before STEP_TIMEOUT (30 s here)."""
    ln = tensor_ring
    stopped = ln.pid("rank2")
    try:
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            ln.client(timeout=120).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        said = e.value.message
        named = re.search(r"rank 2 \(.+\) sent nothing for 1\d s", said)
        assert e.value.status_code == 503 and named, said
        assert time.monotonic() - t0 < 25
        ln.wait_healthy(within=300)
        assert ln.pid("rank2") != stopped
    finally:
        try:
            os.kill(stopped, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the supervisor already killed it, as it should
