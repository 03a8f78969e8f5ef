"""The OpenAI API's errors in process against a stand-in engine (tests/apiutil.py): bad requests
refused in OpenAI's shape before any engine, generated bodies answered or refused but never a
server error, and what a failing, full or closed engine looks like to a client."""

import json

import pytest
from apiutil import ANSWER, client
from fuzzbodies import bodies
from hypothesis import HealthCheck, given, settings
from openaiutil import QUESTION, TOOLS, events

from mlx_ring.serving.port import Failed, QueueFull, Unavailable


@pytest.mark.parametrize(
    "body, status, param, says",
    [
        ({"messages": QUESTION, "temperature": 5}, 400, "temperature", "temperature"),
        ({"messages": []}, 400, "messages", "messages"),
        ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
        (
            {"messages": QUESTION, "logit_bias": {"49152": 1}},
            400,
            "logit_bias",
            "outside this model's vocabulary",
        ),
        ({"messages": QUESTION, "top_k": 49152}, 400, "top_k", "keeps the whole vocabulary"),
        (
            {"messages": QUESTION, "max_tokens": 8192},
            400,
            "max_tokens",
            "is more than 8192: the model's context is 8192",
        ),
        (
            {"messages": QUESTION, "model": "gpt-17"},
            404,
            "model",
            "The model 'gpt-17' does not exist",
        ),
        ({"messages": QUESTION, "tools": TOOLS}, 400, "tools", "chat template has no tool support"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "https://example.com/a.png"},
                            },
                        ],
                    }
                ]
            },
            400,
            "messages",
            "image_url parts are not supported: this model reads text only",
        ),
        (
            {
                "messages": QUESTION,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}},
                },
            },
            400,
            "response_format",
            "uniqueItems",
        ),
        (
            {
                "messages": QUESTION,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"$dynamicRef": "#x"}},
                },
            },
            400,
            "response_format",
            "$dynamicRef",
        ),
        ({"prompt": ""}, 400, "prompt", "at least 1 character"),
        ({"prompt": [1, 49152]}, 400, "prompt", "token id 49152 is outside"),
    ],
)
def test_bad_requests_get_openai_errors_and_reach_no_engine(
    http, engine, body, status, param, says
):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    r = http.post(path, json=body)
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}, r.text
    assert error["param"] == param and says in error["message"], error
    assert error["type"] == "invalid_request_error" and (error["code"] == "model_not_found") == (
        status == 404
    )
    assert engine.submitted == []


def test_bodies_that_are_not_requests(http, engine):
    for content in (b"{not json", b"[1, 2]", b""):
        r = http.post("/v1/chat/completions", content=content)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert (
        http.post("/v1/chat/completions", content=b"{not json").json()["error"]["message"]
        == "the request body is not valid JSON"
    )
    # curl -d sends form-urlencoded: the body is read as JSON all the same
    r = http.post(
        "/v1/chat/completions",
        content=json.dumps({"messages": QUESTION}),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert len(engine.submitted) == 1


def test_an_engine_failure_is_an_openai_error_whole_and_streamed(http, engine):
    engine.fail_after = 2
    r = http.post("/v1/chat/completions", json={"messages": QUESTION})
    # a queued request failed by a drain or a broken ring: when to come back
    assert r.headers["retry-after"] == "5"
    assert r.status_code == 503 and r.json()["error"] == {
        "message": "ring failure: a rank stopped",
        "type": "service_unavailable",
        "param": None,
        "code": None,
    }
    *chunks, error, done = events(
        http.post("/v1/chat/completions", json={"messages": QUESTION, "stream": True})
    )
    assert done == "[DONE]" and error == {
        "error": {
            "message": "ring failure: a rank stopped",
            "type": "service_unavailable",
            "param": None,
            "code": None,
        }
    }
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "The capital"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    engine.failure = Failed("sampling failed for this request: boom", 500, "server_error")
    r = http.post("/v1/completions", json={"prompt": "x"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize(
    "refusal, kind, retry",
    [
        (QueueFull("64 requests are already waiting"), "server_overloaded", "1"),
        (Unavailable("the server is shutting down"), "service_unavailable", "5"),
    ],
)
def test_a_full_queue_or_a_closed_engine_is_a_503_with_retry_after(
    http, engine, refusal, kind, retry
):
    engine.refuse = refusal
    for stream in (False, True):
        r = http.post("/v1/chat/completions", json={"messages": QUESTION, "stream": stream})
        assert (
            r.status_code == 503
            and r.headers["retry-after"] == retry
            and r.json()["error"]["type"] == kind
        )
        assert str(refusal) in r.json()["error"]["message"]


def test_generated_requests_get_an_answer_or_an_openai_error(engine, served):
    """Every generated body is answered (200), refused in OpenAI's shape (400, 404) or streamed to
    its [DONE]; never a server error. The ring's version checks that none harms the ranks."""
    counts = {}
    with client(engine, served, default_max_tokens=2, max_tokens_limit=64) as http:

        @settings(
            max_examples=300,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(bodies())
        def case(path_body):
            path, body = path_body
            r = http.post(path, content=json.dumps(body))
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400, 404), (path, body, r.status_code, r.text[:500])
            if r.status_code != 200:
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"], (
                    r.text
                )
            elif body.get("stream") is True:
                assert r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text, (
                    body,
                    r.text[-500:],
                )
            else:
                assert r.json()["choices"] and r.json()["usage"]["completion_tokens"] >= 1, r.text

        case()
    assert counts.get(200) and counts.get(400)  # both kinds were exercised


def test_warm_http_runs_a_refused_request_through_a_twin_app_and_reaches_no_engine(engine, served):
    from mlx_ring.api.app import make_app, warm_http

    status, body = warm_http(make_app(engine, served))
    # read, validated, templated and tokenized: refused only at the completion limit
    assert (
        status == 400
        and body["error"]["param"] == "max_tokens"
        and "over this server's limit" in body["error"]["message"]
    )
    assert engine.submitted == []
