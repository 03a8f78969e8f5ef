"""Generated bodies for the other dialects' routes, in process against the stand-in engine: each is
answered (200) or refused in that dialect's own error shape (400, 404); never a server error (the
test client raises one that happens mid-stream)."""

import json

import pytest
from apiutil import MODEL, FakeEngine, client, served_model
from fuzzbodies import junk, numbers, odd_text, token_ids
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.utils import load_tokenizer

small = st.integers(1, 4)
schema = (
    st.sampled_from(
        [
            {"type": "object"},
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            {"type": "nope"},
            {},
        ]
    )
    | junk
)
blocks = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": odd_text}),
        st.fixed_dictionaries(
            {
                "type": st.just("tool_use"),
                "id": odd_text,
                "name": odd_text,
                "input": st.just({}) | junk,
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("tool_result"), "tool_use_id": odd_text, "content": odd_text | junk}
        ),
        st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking", "wizard"])}),
        junk,
    ),
    max_size=3,
)
ANTHROPIC = {
    "model": odd_text | st.just(MODEL),
    "max_tokens": small | token_ids,
    "system": odd_text | blocks | junk,
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system"]), "content": odd_text | blocks}
        ),
        max_size=3,
    ),
    "stop_sequences": st.lists(odd_text, max_size=6) | junk,
    "temperature": numbers,
    "top_p": numbers,
    "top_k": token_ids,
    "stream": st.booleans(),
    "metadata": st.fixed_dictionaries({}, optional={"user_id": odd_text}) | junk,
    "tools": st.lists(
        st.fixed_dictionaries({"name": odd_text | st.just("f"), "input_schema": schema}), max_size=2
    )
    | junk,
    "tool_choice": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none", "x"])}, optional={"name": odd_text}
    )
    | junk,
}
items = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "assistant", "developer", "tool"]),
                "content": odd_text | junk,
            }
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("function_call"),
                "call_id": odd_text,
                "name": odd_text,
                "arguments": odd_text,
            }
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("function_call_output"),
                "call_id": odd_text,
                "output": odd_text | junk,
            }
        ),
        st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "message"])}),
        junk,
    ),
    max_size=3,
)
RESPONSES = {
    "model": odd_text | st.just(MODEL),
    "input": odd_text | items,
    "instructions": odd_text | junk,
    "max_output_tokens": small | token_ids,
    "temperature": numbers,
    "top_p": numbers,
    "stream": st.booleans(),
    "previous_response_id": odd_text | junk,
    "store": st.booleans() | junk,
    "tools": st.lists(
        st.fixed_dictionaries(
            {"type": st.just("function"), "name": odd_text | st.just("f"), "parameters": schema}
        ),
        max_size=2,
    )
    | junk,
    "tool_choice": st.sampled_from(["auto", "none", "required", "x"]) | junk,
    "text": st.fixed_dictionaries(
        {
            "format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "json_schema"])},
                optional={"name": odd_text, "schema": schema},
            )
        }
    )
    | junk,
}
OLLAMA = {
    "model": odd_text | st.just(MODEL),
    "stream": st.booleans() | junk,
    "format": st.sampled_from(["", "json", "yaml"]) | schema,
    "options": st.fixed_dictionaries(
        {},
        optional={
            k: numbers | junk
            for k in ("temperature", "top_p", "top_k", "seed", "num_predict", "repeat_penalty")
        },
    )
    | st.fixed_dictionaries(
        {}, optional={"stop": st.lists(odd_text, max_size=6), "num_ctx": token_ids}
    )
    | junk,
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "assistant", "tool", "x"]),
                "content": odd_text | junk,
            },
            optional={"tool_name": odd_text, "images": st.lists(odd_text, max_size=1)},
        ),
        max_size=3,
    ),
    "prompt": odd_text | junk,
    "system": odd_text | junk,
    "raw": st.booleans() | junk,
    "think": st.booleans() | junk,
    "suffix": odd_text,
}
ROUTES = {
    "/v1/messages": (
        ANTHROPIC,
        {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
    ),
    "/v1/messages/count_tokens": (
        ANTHROPIC,
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    ),
    "/v1/responses": (RESPONSES, {"model": MODEL, "input": "Hi", "max_output_tokens": 2}),
    "/api/chat": (
        OLLAMA,
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "options": {"num_predict": 2},
        },
    ),
    "/api/generate": (OLLAMA, {"model": MODEL, "prompt": "Hi", "options": {"num_predict": 2}}),
}


@st.composite
def bodies(draw, path: str):
    fields, body = ROUTES[path][0], dict(ROUTES[path][1])
    for name in draw(
        st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True)
    ):
        body[name] = draw(junk if draw(st.integers(0, 5)) == 0 else fields[name])
    return body


def shaped(path: str, status: int, r) -> bool:
    """The error body is the dialect's own."""
    body = r.json()
    if path.startswith("/api/"):
        return list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    if path.startswith("/v1/messages"):
        return (
            body["type"] == "error"
            and body["error"]["message"]
            and body["error"]["type"].endswith("_error")
        )
    return set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_generated_bodies_get_an_answer_or_the_dialects_error(default_model, path):
    tokenizer = load_tokenizer(default_model)
    engine, counts = FakeEngine(tokenizer), {}
    with client(
        engine, served_model(default_model, tokenizer), default_max_tokens=2, max_tokens_limit=64
    ) as http:

        @settings(
            max_examples=120,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(bodies(path))
        def case(body):
            r = http.post(path, content=json.dumps(body))
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            assert r.status_code in (200, 400, 404), (body, r.status_code, r.text[:500])
            if r.status_code != 200:
                assert shaped(path, r.status_code, r), r.text

        case()
    assert counts.get(200) and counts.get(400), counts  # both kinds were reached


def test_the_openapi_document_shows_every_dialect_in_its_own_error_shape(default_model):
    """The dialects' routes are documented (so tests/unit/api/test_schema.py's fuzz reaches them),
    each with its own error body."""
    tokenizer = load_tokenizer(default_model)
    with client(FakeEngine(tokenizer), served_model(default_model, tokenizer)) as http:
        paths = http.get("/openapi.json").json()["paths"]
    assert "/v1/chat/completions" in paths and all(p in paths for p in ROUTES)
    shape = {
        p: paths[p]["post"]["responses"]["400"]["content"]["application/json"]["schema"]["required"]
        for p in ROUTES
    }
    assert shape == {
        "/v1/messages": ["type", "error"],
        "/v1/messages/count_tokens": ["type", "error"],
        "/v1/responses": ["error"],
        "/api/chat": ["error"],
        "/api/generate": ["error"],
    }
    assert paths["/api/chat"]["post"]["responses"]["400"]["content"]["application/json"]["schema"][
        "properties"
    ]["error"] == {"type": "string"}
