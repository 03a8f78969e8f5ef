"""Each dialect's body checked once, in its own words, in process: every rule of the one internal
request is a rule of the dialect's own model too, named by the client's fields."""

import pytest
from agentutil import JSON, QUESTION, TOOLS
from apiutil import MODEL, client

FN = {"type": "function", "name": "get_weather", "parameters": JSON}


@pytest.mark.parametrize(
    "path,body,says",
    [
        (
            "/v1/messages/count_tokens",
            {
                "model": MODEL,
                "messages": QUESTION,
                "tools": TOOLS,
                "tool_choice": {"type": "any"},
                "output_config": {"format": {"type": "json_schema", "schema": JSON}},
            },
            "output_config.format: a JSON answer and a required tool call exclude each other",
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 9,
                "messages": QUESTION,
                "tool_choice": {"type": "auto"},
            },
            "tool_choice: only allowed when tools are given",
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": "Hi",
                "tools": [FN],
                "tool_choice": "required",
                "text": {"format": {"type": "json_object"}},
            },
            "text.format: a JSON answer and a required tool call exclude each other",
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": "Hi",
                "tools": [FN],
                "tool_choice": {"type": "function", "name": "get_time"},
            },
            "tool_choice: names 'get_time', which is not one of the tools",
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": "Hi",
                "tools": [
                    {"type": "namespace", "name": "n" * 40, "tools": [FN | {"name": "f" * 30}]}
                ],
            },
            "tools: a namespace and its function's name join as "
            f"'{'n' * 40}__{'f' * 30}', over 64 characters",
        ),
        (
            "/api/chat",
            {"model": MODEL, "messages": QUESTION, "options": {"stop": ["a", "b", "c", "d", "e"]}},
            "options.stop: List should have at most 4",
        ),
        (
            "/api/chat",
            {"model": MODEL, "messages": QUESTION, "options": {"seed": 1 << 63}},
            "options.seed: Input should be less than or equal to",
        ),
        (
            "/api/chat",
            {
                "model": MODEL,
                "messages": QUESTION,
                "tools": [{"type": "function", "function": {"name": "a b"}}],
            },
            "tools.0.function.name: String should match pattern",
        ),
        (
            "/api/chat",
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": "hi",
                        "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
                    }
                ],
            },
            "messages.0: only an assistant message carries tool_calls",
        ),
    ],
)
def test_each_dialects_body_is_checked_in_its_own_words(engine, tool_served, path, body, says):
    """Every rule of the one internal request is a rule of the dialect's own model too, named by the
    client's fields (`text.format`, `options.stop`), not by the internal request's."""
    with client(engine, tool_served) as http:
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    message = r.json()["error"] if path.startswith("/api/") else r.json()["error"]["message"]
    assert message.startswith(says), message
    assert engine.submitted == []
