"""OpenAI's Responses API in process, through the official `openai` SDK's `responses`, against
the stand-in engine with the default model's real tokenizer: the same prompt as chat completions,
whole and streamed, function tools and their outputs, text.format json_schema,
previous_response_id, errors."""

import openai
import pytest
from apiutil import ANSWER, CALL, MODEL, WEATHER, FakeEngine, client, templated

from mlx_ring.api.responses_kept import Kept

QUESTION = "What is the capital of France?"
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER,
    }
]


def sdk(http) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
    )


@pytest.fixture
def oa(engine, served):
    with client(engine, served) as http:
        yield sdk(http)


def test_a_response_with_the_same_prompt_as_chat(oa, engine, served):
    r = oa.responses.create(
        model=MODEL, instructions="Be brief.", input=QUESTION, temperature=0, max_output_tokens=100
    )
    [[req]] = engine.submitted
    assert req.prompt == templated(
        served, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    )
    assert (req.params.temperature, req.max_tokens) == (0, 100)
    assert r.id.startswith("resp_") and (r.object, r.status, r.model) == (
        "response",
        "completed",
        MODEL,
    )
    assert r.output_text == ANSWER and [o.type for o in r.output] == ["message"]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (
        len(req.prompt),
        len(engine.answer_ids()) + 1,
    )


def test_max_output_tokens_makes_it_incomplete(oa):
    r = oa.responses.create(model=MODEL, input=QUESTION, max_output_tokens=3)
    assert (r.status, r.incomplete_details.reason, r.output_text) == (
        "incomplete",
        "max_output_tokens",
        "The capital of",
    )


def test_a_stream_of_response_events(oa, engine):
    events = list(
        oa.responses.create(model=MODEL, input=[{"role": "user", "content": QUESTION}], stream=True)
    )
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (
        events[-1].response.output_text == ANSWER
        and events[-1].response.usage.output_tokens == len(engine.answer_ids()) + 1
    )
    with oa.responses.stream(model=MODEL, input=QUESTION) as s:  # the SDK's own accumulating helper
        assert s.get_final_response().output_text == ANSWER


def test_previous_response_id_continues_the_conversation(oa, engine, served):
    first = oa.responses.create(model=MODEL, input=QUESTION)
    engine.answer = "Lyon is second."
    second = oa.responses.create(
        model=MODEL, input="And the second city?", previous_response_id=first.id
    )
    chat = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And the second city?"},
    ]
    assert (
        engine.submitted[1][0].prompt == templated(served, chat)
        and second.previous_response_id == first.id
    )
    assert oa.responses.retrieve(second.id).output_text == "Lyon is second."
    with pytest.raises(openai.NotFoundError) as e:
        oa.responses.create(model=MODEL, input="Hi", previous_response_id="resp_gone")
    assert (
        e.value.body["code"] == "previous_response_not_found"
        and "resp_gone" in e.value.body["message"]
    )
    unkept = oa.responses.create(model=MODEL, input="Not kept", store=False)
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model=MODEL, input="Hi", previous_response_id=unkept.id)


def test_the_store_is_bounded():
    kept = Kept(2)
    for rid in ("a", "b", "c"):
        kept.put(rid, [], {"id": rid})
    assert list(kept.items) == ["b", "c"]
    with pytest.raises(Exception, match="keeps its last 2"):
        kept.get("a")


def test_function_tools_and_their_outputs(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    with client(engine, tool_served) as http:
        oa = sdk(http)
        r = oa.responses.create(model=MODEL, input=QUESTION, tools=TOOLS)
        [call] = r.output
        assert (call.type, call.name, call.arguments) == (
            "function_call",
            "get_weather",
            '{"city": "Paris"}',
        )
        engine.answer = "It is sunny."
        turn = [
            {"role": "user", "content": QUESTION},
            call,
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"},
        ]
        assert (
            oa.responses.create(model=MODEL, input=turn, tools=TOOLS).output_text == "It is sunny."
        )
        chat = [
            {"role": "user", "content": QUESTION},
            # an answer of this server's comes back as the model wrote it
            {"role": "assistant", "content": CALL},
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny"},
        ]
        tools = [
            {"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}
        ]
        assert engine.submitted[1][0].prompt == templated(tool_served, chat, tools=tools)
        engine.answer = CALL
        events = list(
            oa.responses.create(
                model=MODEL, input=QUESTION, tools=TOOLS, tool_choice="required", stream=True
            )
        )
        assert engine.submitted[-1][0].params.grammar is not None
        # as they are generated
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert (
            len(deltas) > 1
            and "".join(deltas) == '{"city": "Paris"}'
            and events[-1].response.output[0].type == "function_call"
        )


def test_text_format_json_schema_is_enforced_by_the_grammar(oa, engine):
    fmt = {
        "type": "json_schema",
        "name": "city",
        "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
    }
    oa.responses.create(model=MODEL, input=QUESTION, text={"format": fmt})
    assert engine.submitted[0][0].params.grammar is not None
    oa.responses.create(model=MODEL, input=QUESTION, text={"format": {"type": "json_object"}})
    assert engine.submitted[1][0].params.grammar is not None


def test_errors_in_openais_shape(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.responses.create(model=MODEL, input=QUESTION, max_output_tokens=0)
    assert e.value.body["param"] == "max_output_tokens"
    with pytest.raises(
        openai.BadRequestError,
        match="input.0.content.0: input_image parts are not supported by this text model",
    ):
        oa.responses.create(
            model=MODEL,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                }
            ],
        )
    with pytest.raises(
        openai.BadRequestError, match="tools: this model's chat template has no tool support"
    ):
        oa.responses.create(model=MODEL, input=QUESTION, tools=TOOLS)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oa.responses.create(model="gpt-5", input=QUESTION)
    with pytest.raises(openai.NotFoundError, match="resp_nope"):
        oa.responses.retrieve("resp_nope")


def test_a_failure_mid_stream_fails_the_response(engine, served):
    engine.fail_after = 2
    with client(engine, served) as http:
        events = list(sdk(http).responses.create(model=MODEL, input=QUESTION, stream=True))
    assert (
        events[-1].type == "response.failed"
        and "a rank stopped" in events[-1].response.error.message
    )


def test_cached_tokens_in_the_usage(oa, engine):
    engine.cached = 4
    r = oa.responses.create(model=MODEL, input=QUESTION)
    assert r.usage.input_tokens_details.cached_tokens == 4 and r.usage.input_tokens == len(
        engine.submitted[-1][0].prompt
    )
