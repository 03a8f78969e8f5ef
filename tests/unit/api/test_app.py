"""The OpenAI API in process against a stand-in engine (tests/apiutil.py), with the default model's
real tokenizer and chat template: response shapes whole and streamed, validation errors in OpenAI's
shape, tool calls, and what a failing engine looks like to a client."""

import json

import openai
import pytest
from apiutil import ANSWER, CALL, MODEL, WEATHER, FakeEngine, client
from fuzzbodies import bodies
from hypothesis import HealthCheck, given, settings

from mlx_ring.serving.port import Failed, QueueFull, Unavailable

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER,
        },
    }
]


@pytest.fixture
def http(engine, served):
    with client(engine, served) as c:
        yield c


@pytest.fixture
def oa(http):
    """The official client, over the in-process app."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
    )


def events(response) -> list:
    """A stream's server-sent events: JSON objects, then the closing "[DONE]"."""
    lines = [ln for ln in response.text.split("\n\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines), response.text
    return [ln[6:] if ln == "data: [DONE]" else json.loads(ln[6:]) for ln in lines]


def test_a_chat_answer_in_openai_shape(oa, engine, served):
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    prompt = served.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    [[req]] = engine.submitted
    assert req.prompt == prompt and req.params.temperature == 0 and req.max_tokens == 512
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    [choice] = r.choices
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "stop", None)
    assert (choice.message.role, choice.message.content, choice.message.tool_calls) == (
        "assistant",
        ANSWER,
        None,
    )
    n = len(engine.answer_ids()) + 1  # and the end token
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(prompt),
        n,
        len(prompt) + n,
    )
    assert engine.cancelled == [req]  # every request is released when its answer ends


def test_length_limit_and_chat_logprobs(oa, engine, served):
    r = oa.chat.completions.create(
        model=MODEL, messages=QUESTION, max_completion_tokens=3, logprobs=True, top_logprobs=2
    )
    ids = engine.answer_ids()[:3]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.choices[0].message.content == served.tokenizer.decode(ids) == "The capital of"
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [served.tokenizer.decode([i]) for i in ids] and [
        c.logprob for c in content
    ] == [-0.5] * 3
    assert [[t.logprob for t in c.top_logprobs] for c in content] == [[-0.5, -1.5]] * 3
    assert content[0].bytes == list(content[0].token.encode())


def test_completions_with_logprobs_and_models(oa, engine, served):
    r = oa.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, logprobs=2
    )
    [[req]] = engine.submitted
    assert req.prompt == served.tokenizer.encode("The capital of France is")
    assert (
        r.object == "text_completion"
        and r.id.startswith("cmpl-")
        and r.choices[0].finish_reason == "length"
    )
    assert r.choices[0].text == "The capital of France"
    lp = r.choices[0].logprobs
    assert (
        len(lp.tokens) == 4
        and lp.token_logprobs == [-0.5] * 4
        and all(len(t) == 2 for t in lp.top_logprobs)
    )
    ids = oa.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)
    assert engine.submitted[1][0].prompt == [1, 2, 3] and ids.usage.prompt_tokens == 3
    assert [(m.id, m.object, m.owned_by) for m in oa.models.list().data] == [
        (MODEL, "model", "mlx-ring")
    ]


def test_a_stream_is_role_content_finish_usage_done(http, engine):
    ask = {
        "model": MODEL,
        "messages": QUESTION,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = http.post("/v1/chat/completions", json=ask)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    *chunks, usage, done = events(r)
    assert done == "[DONE]"
    assert {c["object"] for c in chunks + [usage]} == {"chat.completion.chunk"} and len(
        {c["id"] for c in chunks + [usage]}
    ) == 1
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": None,
            "delta": {"role": "assistant", "content": ""},
        }
    ]
    assert chunks[-1]["choices"] == [
        {"index": 0, "logprobs": None, "finish_reason": "stop", "delta": {}}
    ]
    middle = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert (
        all(set(d) == {"content"} for d in middle)
        and "".join(d["content"] for d in middle) == ANSWER
    )
    n = len(engine.answer_ids()) + 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    whole = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION}).json()
    assert whole["choices"][0]["message"]["content"] == ANSWER and whole["usage"] == usage["usage"]


def test_a_completions_stream_and_a_stop_string(http):
    r = http.post("/v1/completions", json={"prompt": "Say it.", "stream": True, "stop": [" Paris"]})
    *chunks, done = events(r)
    assert done == "[DONE]" and {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The capital of France is"
    assert [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    ] == ["stop"]


def test_n_choices_are_queued_together_each_after_the_first(oa, engine):
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION, n=3, seed=7, temperature=1)
    [reqs] = engine.submitted
    assert [q.after for q in reqs] == [None, reqs[0], reqs[0]]
    # each choice its own seed, derived from the request's
    assert len({q.params.seed for q in reqs}) == 3
    assert [c.index for c in r.choices] == [0, 1, 2] and {c.message.content for c in r.choices} == {
        ANSWER
    }
    n = len(engine.answer_ids()) + 1
    assert r.usage.completion_tokens == 3 * n and r.usage.prompt_tokens == len(reqs[0].prompt)


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


def test_fields_clients_add_are_accepted(oa, engine):
    r = oa.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=3,
        temperature=0,
        store=True,
        metadata={"app": "test"},
        user="u-1",
        service_tier="auto",
        prompt_cache_key="k",
        parallel_tool_calls=False,
    )
    assert (
        r.choices[0].message.content == "The capital of" and r.choices[0].finish_reason == "length"
    )
    assert engine.tokenizer.decode(engine.submitted[0][0].prompt).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_tool_call_in_openai_shape_whole_and_streamed(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS}
    with client(engine, tool_served) as http:
        whole = http.post("/v1/chat/completions", json=ask).json()
        streamed = events(http.post("/v1/chat/completions", json=dict(ask, stream=True)))
    [choice] = whole["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert engine.submitted[0][0].params.grammar is None  # "auto": the model may answer in text
    deltas = [c["choices"][0]["delta"] for c in streamed[:-1]]
    # the id and name, then the arguments as they come
    [head, *rest] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert head == [
        {
            "index": 0,
            "id": head[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert len(rest) > 1 and all(
        [c] == [{"index": 0, "function": {"arguments": c["function"]["arguments"]}}] for [c] in rest
    )
    assert "".join(c["function"]["arguments"] for [c] in rest) == call["function"]["arguments"]
    assert "".join(d.get("content") or "" for d in deltas) == ""  # the call's text is not content
    assert [
        c["choices"][0]["finish_reason"] for c in streamed[:-1] if c["choices"][0]["finish_reason"]
    ] == ["tool_calls"]


def test_a_named_tool_is_forced_by_a_grammar(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    with client(engine, tool_served) as http:
        r = http.post(
            "/v1/chat/completions",
            json={
                "messages": QUESTION,
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
        )
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
        grammar = engine.submitted[0][0].params.grammar
        assert grammar is not None and "get_weather" in grammar
        r = http.post(
            "/v1/chat/completions",
            json={"messages": QUESTION, "tools": TOOLS, "tool_choice": "none"},
        )
    assert engine.submitted[1][0].params.grammar is None
    # none: no tools offered
    assert "get_weather" not in tool_served.tokenizer.decode(engine.submitted[1][0].prompt)


def test_a_tool_result_turn_reaches_the_template(tool_served):
    engine = FakeEngine(tool_served.tokenizer)
    turns = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    with client(engine, tool_served) as http:
        r = http.post("/v1/chat/completions", json={"messages": turns, "tools": TOOLS})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    prompt = tool_served.tokenizer.decode(engine.submitted[0][0].prompt)
    want = tool_served.tokenizer.apply_chat_template(
        [
            QUESTION[0],
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
        ],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        prompt == want
        and '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        and "21 degrees and sunny" in prompt
    )


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


def test_cached_tokens_in_usage_whole_and_streamed(oa, engine):
    assert (
        oa.chat.completions.create(
            model=MODEL, messages=QUESTION
        ).usage.prompt_tokens_details.cached_tokens
        == 0
    )
    engine.cached = 7
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION)
    assert (r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens) == (
        7,
        len(engine.submitted[-1][0].prompt),
    )
    chunks = list(
        oa.chat.completions.create(
            model=MODEL, messages=QUESTION, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 7
    assert (
        oa.completions.create(
            model=MODEL, prompt="The capital of France is"
        ).usage.prompt_tokens_details.cached_tokens
        == 7
    )


def test_served_name_and_aliases(engine, served):
    with client(engine, served, id="smol", aliases=("claude-*", "gpt-4o")) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        assert [m.id for m in oa.models.list().data] == ["smol", "gpt-4o"]
        r = oa.chat.completions.create(model="claude-sonnet-4-5", messages=QUESTION)
        # the answer names the model that gave it
        assert r.choices[0].message.content == ANSWER and r.model == "smol"
        assert (
            oa.models.retrieve("claude-opus-4-1").id == "claude-opus-4-1"
            and oa.models.retrieve("default").id == "smol"
        )
        for name in (MODEL, "gpt-4o-mini"):
            with pytest.raises(openai.NotFoundError) as e:
                oa.chat.completions.create(model=name, messages=QUESTION)
            assert (
                e.value.body["code"] == "model_not_found"
                and "MODEL_ALIASES" in e.value.body["message"]
            )
        with pytest.raises(openai.NotFoundError):
            oa.models.retrieve("gpt-4o-mini")
