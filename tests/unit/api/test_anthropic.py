"""Anthropic's Messages API in process, through the official `anthropic` SDK, against the stand-in
engine with the default model's real tokenizer: the same prompt and parameters as chat completions,
the message whole and streamed, tools both ways, token counting, and errors in Anthropic's shape."""

import anthropic
import pytest
from apiutil import ANSWER, CALL, MODEL, WEATHER, FakeEngine, client

from mlx_ring.api.keys import Key
from mlx_ring.serving.port import QueueFull

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]


def sdk(http, key="unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://testserver", api_key=key, max_retries=0, http_client=http
    )


@pytest.fixture
def ant(engine, served):
    with client(engine, served) as http:
        yield sdk(http)


def test_a_message_with_the_same_prompt_and_sampling_as_chat(ant, engine, served):
    m = ant.messages.create(
        model=MODEL,
        max_tokens=100,
        system="Be brief.",
        messages=QUESTION,
        stop_sequences=["Rome"],
        metadata={"user_id": "u1"},
        extra_body={"temperature": 0, "top_k": 5},
    )
    [[req]] = engine.submitted
    chat = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert req.prompt == served.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert (req.params.temperature, req.params.top_k, req.max_tokens, req.stop) == (
        0,
        5,
        100,
        ["Rome"],
    )
    assert m.id.startswith("msg_") and (m.type, m.role, m.model) == ("message", "assistant", MODEL)
    assert [(b.type, b.text) for b in m.content] == [("text", ANSWER)]
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    assert (m.usage.input_tokens, m.usage.output_tokens) == (
        len(req.prompt),
        len(engine.answer_ids()) + 1,
    )


def test_max_tokens_ends_the_message(ant):
    m = ant.messages.create(model=MODEL, max_tokens=3, messages=QUESTION)
    assert (
        m.stop_reason == "max_tokens"
        and m.content[0].text == "The capital of"
        and m.usage.output_tokens == 3
    )


def test_a_stream_in_anthropics_event_sequence(ant, engine):
    with ant.messages.stream(model=MODEL, max_tokens=100, messages=QUESTION) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    assert (
        types[0] == "message_start"
        and types[-1] == "message_stop"
        and "text" in types
        and "message_delta" in types
    )
    assert final.content[0].text == ANSWER and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(engine.answer_ids()) + 1


def test_the_raw_stream_names_every_event(engine, served):
    with client(engine, served) as http:
        r = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 100, "messages": QUESTION, "stream": True},
        )
    names = [ln[7:] for ln in r.text.split("\n") if ln.startswith("event: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert set(names[3:-3]) == {"content_block_delta"} and names[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_tools_round_trip(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    with client(engine, tool_served) as http:
        ant = sdk(http)
        m = ant.messages.create(model=MODEL, max_tokens=100, messages=QUESTION, tools=TOOLS)
        [block] = m.content
        assert (block.type, block.name, block.input, m.stop_reason) == (
            "tool_use",
            "get_weather",
            {"city": "Paris"},
            "tool_use",
        )
        turn = [
            *QUESTION,
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": block.id, "content": "Sunny, 21 C"}
                ],
            },
        ]
        engine.answer = "It is sunny."
        second = ant.messages.create(model=MODEL, max_tokens=100, messages=turn, tools=TOOLS)
        assert second.content[0].text == "It is sunny."
        chat = [
            *QUESTION,
            # an answer of this server's comes back as the model wrote it
            {"role": "assistant", "content": CALL},
            {"role": "tool", "tool_call_id": block.id, "content": "Sunny, 21 C"},
        ]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": WEATHER,
                },
            }
        ]
        assert engine.submitted[1][0].prompt == tool_served.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tools=tools
        )
        engine.answer = CALL
        with ant.messages.stream(
            model=MODEL, max_tokens=100, messages=QUESTION, tools=TOOLS, tool_choice={"type": "any"}
        ) as s:
            final = s.get_final_message()
        # "any": a call is enforced by the grammar
        assert engine.submitted[-1][0].params.grammar is not None
        assert [(b.type, b.input) for b in final.content] == [
            ("tool_use", {"city": "Paris"})
        ] and final.stop_reason == "tool_use"
        ant.messages.create(
            model=MODEL, max_tokens=10, messages=QUESTION, tools=TOOLS, tool_choice={"type": "none"}
        )
        assert "get_weather" not in tool_served.tokenizer.decode(engine.submitted[-1][0].prompt)


def test_count_tokens_is_the_templated_prompt(ant, served):
    n = ant.messages.count_tokens(model=MODEL, system="Be brief.", messages=QUESTION).input_tokens
    assert n == len(
        served.tokenizer.apply_chat_template(
            [{"role": "system", "content": "Be brief."}, *QUESTION], add_generation_prompt=True
        )
    )


def test_errors_in_anthropics_shape(ant, engine):
    with pytest.raises(anthropic.BadRequestError) as e:
        ant.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)
    assert (
        e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    )
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        ant.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
    with pytest.raises(
        anthropic.BadRequestError, match="tools: this model's chat template has no tool support"
    ):
        ant.messages.create(model=MODEL, max_tokens=5, messages=QUESTION, tools=TOOLS)
    with pytest.raises(anthropic.NotFoundError) as e:
        ant.messages.create(model="claude-opus-4", max_tokens=5, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error"
    engine.refuse = QueueFull("64 requests are already waiting")
    with pytest.raises(anthropic.InternalServerError) as e:
        ant.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
    assert e.value.status_code == 503 and e.value.body["error"]["type"] == "overloaded_error"


def test_a_failure_mid_stream_is_an_error_event(engine, served):
    engine.fail_after = 2
    with client(engine, served) as http:
        r = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 100, "messages": QUESTION, "stream": True},
        )
    last = r.text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\n") and '"overloaded_error"' in last
    assert engine.cancelled  # the request is released


def test_x_api_key_is_an_api_key(engine, served):
    keys = [Key("alice", b"Bearer sk-alice-1", rpm=1)]
    with client(engine, served, keys) as http:
        assert (
            sdk(http, "sk-alice-1")
            .messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
            .content
        )
        with pytest.raises(anthropic.RateLimitError):  # the same key, the same limits
            sdk(http, "sk-alice-1").messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
        with pytest.raises(anthropic.AuthenticationError):
            sdk(http, "sk-wrong-1").messages.create(model=MODEL, max_tokens=5, messages=QUESTION)


def test_cached_tokens_are_read_from_the_cache_and_not_input(ant, engine):
    engine.cached = 9
    m = ant.messages.create(model=MODEL, max_tokens=100, messages=QUESTION)
    prompt = len(engine.submitted[-1][0].prompt)
    assert (
        m.usage.input_tokens,
        m.usage.cache_read_input_tokens,
        m.usage.cache_creation_input_tokens,
    ) == (prompt - 9, 9, 0)
    with ant.messages.stream(model=MODEL, max_tokens=100, messages=QUESTION) as s:
        final = s.get_final_message()
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (prompt - 9, 9)
    # message_start already splits the prompt as Anthropic's does (its input_tokens
    # are not cache reads)
    events = list(ant.messages.create(model=MODEL, max_tokens=100, messages=QUESTION, stream=True))
    start, delta = events[0], next(e for e in events if e.type == "message_delta")
    assert start.type == "message_start"
    assert (
        start.message.usage.input_tokens,
        start.message.usage.cache_read_input_tokens,
        start.message.usage.cache_creation_input_tokens,
        start.message.usage.output_tokens,
    ) == (prompt - 9, 9, 0, 0)
    assert (
        delta.usage.input_tokens,
        delta.usage.cache_read_input_tokens,
        delta.usage.output_tokens,
    ) == (prompt - 9, 9, m.usage.output_tokens)
    # a failure before the first token: message_start (nothing read from the cache), then the error
    engine.fail_after = 0
    with pytest.raises(anthropic.APIStatusError, match="a rank stopped"):
        list(ant.messages.create(model=MODEL, max_tokens=100, messages=QUESTION, stream=True))


def test_claude_model_names_by_alias(engine, served):
    with client(engine, served, aliases=("claude-*",)) as http:
        ant = sdk(http)
        m = ant.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION)
        assert m.content[0].text == ANSWER and m.model == MODEL
        with pytest.raises(anthropic.NotFoundError) as e:
            ant.messages.create(model="gpt-4o", max_tokens=100, messages=QUESTION)
        assert (
            e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
        )
