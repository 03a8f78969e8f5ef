"""The fields agents send that a model may not use, in every dialect, in process: accepted
and ignored where they change nothing (reasoning effort, thinking off, cache_control),
honoured where they can be (output_config.format), refused by name where they would change
the answer ("not supported by this server/model"); max_tokens over the room the context
leaves (cut to it in the agent dialects, a 400 in chat completions); Anthropic's
stop_sequence; images where only text fits."""

import anthropic
import openai
import pytest
from agentutil import JSON, QUESTION, TOOLS
from apiutil import MODEL, FakeEngine, client, templated


def ant(http) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://testserver", api_key="unused", max_retries=0, http_client=http
    )


def oa(http) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
    )


def refusal(http, path: str, body: dict) -> str:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    return err["message"]


# -- item: fields a model cannot use ------------------------------------------------------------


def test_chat_reasoning_effort_is_accepted_and_changes_nothing(engine, served):
    with client(engine, served) as http:
        plain = oa(http).chat.completions.create(model=MODEL, messages=QUESTION)
        asked = oa(http).chat.completions.create(
            model=MODEL, messages=QUESTION, reasoning_effort="low", modalities=["text"]
        )
        assert asked.choices[0].message.content == plain.choices[0].message.content
        assert engine.submitted[0][0].prompt == engine.submitted[1][0].prompt
        assert "Extra inputs are not permitted" in refusal(
            http, "/v1/chat/completions", {"messages": QUESTION, "reasoning_efort": "low"}
        )
        assert refusal(
            http, "/v1/chat/completions", {"messages": QUESTION, "reasoning_effort": "turbo"}
        ).startswith("reasoning_effort:")
        assert (
            refusal(
                http,
                "/v1/chat/completions",
                {"messages": QUESTION, "audio": {"voice": "alloy", "format": "wav"}},
            )
            == "audio: not supported by this server/model: it answers in text only"
        )
        assert refusal(
            http, "/v1/chat/completions", {"messages": QUESTION, "modalities": ["text", "audio"]}
        ).startswith("modalities: not supported by this server/model")
    assert len(engine.submitted) == 2  # refusals queue nothing


def test_responses_reasoning_null_or_an_effort_is_accepted(engine, served):
    with client(engine, served) as http:
        for reasoning in (None, {"effort": "high", "summary": "detailed"}, {"effort": "none"}):
            r = http.post(
                "/v1/responses",
                json={
                    "model": MODEL,
                    "input": "What is the capital of France?",
                    "reasoning": reasoning,
                },
            )
            assert r.status_code == 200, r.text
        assert len({tuple(s[0].prompt) for s in engine.submitted}) == 1
        body = {"model": MODEL, "input": "Hi"}
        assert refusal(http, "/v1/responses", body | {"reasoning": {"effort": "turbo"}}).startswith(
            "reasoning.effort:"
        )
        assert refusal(http, "/v1/responses", body | {"background": True}) == (
            "background: not supported by this server/model: a response is made "
            "while its request is open"
        )
        assert refusal(
            http, "/v1/responses", body | {"tools": [{"type": "file_search"}]}
        ).startswith("tools.0: file_search tools are not supported by this server")
        assert "Extra inputs are not permitted" in refusal(
            http, "/v1/responses", body | {"reasonning": None}
        )


def test_anthropic_thinking_cache_control_and_output_config(engine, served):
    with client(engine, served) as http:
        plain = ant(http).messages.create(model=MODEL, max_tokens=100, messages=QUESTION)
        for extra in (
            {"thinking": {"type": "disabled"}},
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            {"thinking": {"type": "adaptive"}},
            {"cache_control": {"type": "ephemeral"}},
            {"output_config": {"effort": "low"}},
        ):
            m = ant(http).messages.create(
                model=MODEL, max_tokens=100, messages=QUESTION, extra_body=extra
            )
            # no thinking blocks
            assert [(b.type, b.text) for b in m.content] == [
                (b.type, b.text) for b in plain.content
            ], extra
        assert len({tuple(s[0].prompt) for s in engine.submitted}) == 1
        body = {"model": MODEL, "max_tokens": 100, "messages": QUESTION}
        assert "budget_tokens: Input should be greater than or equal to 1024" in refusal(
            http, "/v1/messages", body | {"thinking": {"type": "enabled", "budget_tokens": 100}}
        )
        assert refusal(
            http,
            "/v1/messages",
            body | {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]},
        ).startswith("mcp_servers: not supported by this server/model")
        assert refusal(
            http,
            "/v1/messages",
            body | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        ).startswith("tools.0: web_search_20250305 tools are not supported by this server")
        assert "Extra inputs are not permitted" in refusal(
            http, "/v1/messages", body | {"thinkng": {"type": "disabled"}}
        )


def test_anthropic_output_config_format_is_honoured(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer='{"city": "Paris"}')
    with client(engine, tool_served) as http:
        m = ant(http).messages.create(
            model=MODEL,
            max_tokens=100,
            messages=QUESTION,
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": JSON}}},
        )
        assert (
            m.content[0].text == '{"city": "Paris"}'
            and engine.submitted[0][0].params.grammar is not None
        )
        body = {
            "model": MODEL,
            "max_tokens": 100,
            "messages": QUESTION,
            "tools": TOOLS,
            "tool_choice": {"type": "any"},
            "output_config": {"format": {"type": "json_schema", "schema": JSON}},
        }
        assert refusal(http, "/v1/messages", body).startswith(
            "output_config.format: a JSON answer and a required tool call exclude each other"
        )


# -- item: max_tokens over what the context leaves -------------------------------------------------


def test_agent_dialects_cut_max_tokens_to_the_room_left(engine, served):
    prompt = templated(served, QUESTION)
    with client(engine, served, context_length=len(prompt) + 3) as http:
        # the SDK's own check wants a stream
        m = ant(http).messages.create(model=MODEL, max_tokens=32000, messages=QUESTION, timeout=60)
        assert (engine.submitted[-1][0].max_tokens, m.stop_reason, m.content[0].text) == (
            3,
            "model_context_window_exceeded",
            "The capital of",
        )
        # its own limit, not the context's
        m = ant(http).messages.create(model=MODEL, max_tokens=2, messages=QUESTION)
        assert (engine.submitted[-1][0].max_tokens, m.stop_reason) == (2, "max_tokens")
        with ant(http).messages.stream(model=MODEL, max_tokens=32000, messages=QUESTION) as s:
            assert s.get_final_message().stop_reason == "model_context_window_exceeded"
        r = oa(http).responses.create(model=MODEL, input=QUESTION, max_output_tokens=32000)
        assert (engine.submitted[-1][0].max_tokens, r.status, r.incomplete_details.reason) == (
            3,
            "incomplete",
            "max_output_tokens",
        )
        r = http.post(
            "/api/chat",
            json={
                "model": MODEL,
                "messages": QUESTION,
                "stream": False,
                "options": {"num_predict": 32000},
            },
        )
        assert (engine.submitted[-1][0].max_tokens, r.json()["done_reason"]) == (3, "length")
        # chat completions keeps OpenAI's answer: a 400 that says how much room there is
        with pytest.raises(openai.BadRequestError) as e:
            oa(http).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=30)
        assert e.value.code == "context_length_exceeded" and "ask for at most 3" in e.value.message


def test_the_servers_own_limit_is_a_limit_not_the_context(engine, served):
    with client(engine, served, max_tokens_limit=2) as http:
        m = ant(http).messages.create(model=MODEL, max_tokens=32000, messages=QUESTION, timeout=60)
    assert (engine.submitted[-1][0].max_tokens, m.stop_reason) == (2, "max_tokens")


# -- item: Anthropic's stop reason and string; images where only text fits
# --------------------------


def test_a_stop_sequence_is_named(engine, served):
    with client(engine, served) as http:
        m = ant(http).messages.create(
            model=MODEL, max_tokens=100, messages=QUESTION, stop_sequences=["Rome", " Paris"]
        )
        assert (m.stop_reason, m.stop_sequence, m.content[0].text) == (
            "stop_sequence",
            " Paris",
            "The capital of France is",
        )
        with ant(http).messages.stream(
            model=MODEL, max_tokens=100, messages=QUESTION, stop_sequences=["France"]
        ) as s:
            final = s.get_final_message()
        assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (
            "stop_sequence",
            "France",
            "The capital of ",
        )
        m = ant(http).messages.create(
            model=MODEL, max_tokens=100, messages=QUESTION, stop_sequences=["Rome"]
        )
        assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)


def test_images_where_only_text_fits_are_refused_by_place(engine, served):
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    turn = [
        *QUESTION,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}],
        },
    ]
    with client(engine, served) as http:
        assert refusal(
            http, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": turn}
        ) == (
            "messages.2.content.0.content.0: image blocks are not supported by this text "
            "model; send text blocks"
        )
        assert refusal(
            http,
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [image]}],
            },
        ) == (
            "messages.0.content.0: image blocks are not supported by this text "
            "model; send text blocks"
        )
        items = [
            {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "It shows:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA=="},
                ],
            },
        ]
        r = http.post("/v1/responses", json={"model": MODEL, "input": items})
        assert r.status_code == 400 and r.json()["error"] == {
            "message": (
                "input.1.output.1: input_image parts are not supported by this text "
                "model; send input_text"
            ),
            "type": "invalid_request_error",
            "param": "input.1.output.1",
            "code": None,
        }
        assert "image_url parts are not supported" in refusal(
            http,
            "/v1/chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AA=="},
                            }
                        ],
                    }
                ]
            },
        )
        assert http.post(
            "/api/chat",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi", "images": ["AA=="]}],
            },
        ).json() == {"error": "messages.0: images are not supported by this text model; send text"}
        assert http.post(
            "/api/generate", json={"model": MODEL, "prompt": "hi", "images": ["AA=="]}
        ).json() == {
            "error": "images: not supported by this server/model: it is a text model; send text"
        }
    assert not engine.submitted
