"""Tool-call arguments streamed as they are generated: the incremental reader of mlx-lm's JSON call
format on text split at every position and on generated JSON, and each dialect's stream read by the
official SDKs' stream helpers (which accumulate the partial JSON) against the in-process app."""

import json

import anthropic
import openai
from apiutil import MODEL, WEATHER, FakeEngine, client
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from mlx_ring.api.toolcalls import ToolCallText

QUESTION = [{"role": "user", "content": "What is the weather in Sao Paulo?"}]
ARGS = {
    "city": "São Paulo",
    "days": [1, 2.5, -0.0, 1e3],
    "unit": None,
    "note": 'say "hi"\n😀 \u00e9',
    "deep": {"x": [], "y": {}},
}
# How a model may write the call: its own spacing, escapes (a surrogate pair), a number
# json.dumps writes otherwise.
CALL_TEXT = (
    '{"name":"get_weather" ,"arguments" : {"city": "S\\u00e3o Paulo", '
    '"days":[1,2.5,-0.0, 1E3],"unit":null,'
    '"note":"say \\"hi\\"\\n\\ud83d\\ude00 \\u00e9","deep":{"x":[ ],"y":{}}}}'
)
ANSWER = f"Let me check. <tool_call>\n{CALL_TEXT}\n</tool_call>"
WANT = json.dumps(ARGS, ensure_ascii=False)  # the arguments a non-streamed answer has


def reader(stream=True, parse=json_tools.parse_tool_call, **kw) -> ToolCallText:
    return ToolCallText("<tool_call>", "</tool_call>", parse, [], stream=stream, **kw)


def read(pieces, **kw) -> list[tuple]:
    t = reader(**kw)
    parts = [p for piece in pieces for p in t.feed(piece)]
    return parts + t.finish()


def check_streamed(parts, text: str, args: str, name: str = "get_weather"):
    """The parts of one streamed call: text, its head, argument fragments joining
    to `args`, its end."""
    kinds = [k for k, _, _ in parts]
    assert [k for k in kinds if k != "text" and k != "args"] == ["begin", "end"]
    begin, end = kinds.index("begin"), kinds.index("end")
    assert all(k == "args" for k in kinds[begin + 1 : end])
    head, call = parts[begin][2], parts[end][2]
    assert head["function"] == {"name": name, "arguments": ""} and call["id"] == head["id"]
    assert "".join(v for k, _, v in parts if k == "args") == call["function"]["arguments"] == args
    assert "".join(v for k, _, v in parts if k == "text") == text


def test_the_arguments_join_to_the_whole_parse_at_every_split():
    [_, (kind, _, whole)] = read([ANSWER], stream=False)
    assert kind == "call" and whole["function"] == {"name": "get_weather", "arguments": WANT}
    for i in range(len(ANSWER) + 1):
        check_streamed(read([ANSWER[:i], ANSWER[i:]]), "Let me check. ", WANT)
    by_char = read(list(ANSWER))
    check_streamed(by_char, "Let me check. ", WANT)
    # fragments as the text comes, strings inside too
    assert sum(k == "args" for k, _, _ in by_char) > 20


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    args=st.dictionaries(st.text(max_size=6), JSON, max_size=5),
    compact=st.booleans(),
    ascii=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=6),
)
def test_any_arguments_object_streams_as_the_whole_parse_writes_it(args, compact, ascii, cuts):
    body = json.dumps(
        {"name": "f", "arguments": args},
        ensure_ascii=ascii,
        separators=(",", ":") if compact else None,
    )
    text = f"<tool_call>\n{body}\n</tool_call>"
    cuts = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    check_streamed(read(pieces), "", json.dumps(args, ensure_ascii=False), name="f")


def test_what_cannot_stream_comes_whole():
    # arguments that are no object, a list of calls, a body that is no JSON: parsed whole at the
    # end, as without streaming
    for body in [
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',
        '[{"name": "f", "arguments": {"a": 1}}]',
    ]:
        parts = read(list(f"<tool_call>{body}</tool_call>"))
        assert [(k, v["function"]["arguments"]) for k, _, v in parts] == [("call", '{"a": 1}')]
    broken = "<tool_call>{name: f}</tool_call>"
    assert "".join(v for _, _, v in read(list(broken))) == broken
    # a format whose parser reads only a whole call
    xml = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    parts = read(list(xml), parse=qwen3_coder.parse_tool_call)
    assert [(k, v["function"]["name"]) for k, _, v in parts] == [("call", "f")]


def test_calls_in_order_each_with_its_index():
    one = '<tool_call>{"name": "a", "id": "call_model", "arguments": {"x": 1}}</tool_call>'
    # the name after the arguments: sent once known
    two = '<tool_call>{"arguments": {"y": [2]}, "name": "b"}</tool_call>'
    parts = read(list(one + " and " + two))
    assert [(k, n) for k, n, _ in parts if k in ("begin", "end")] == [
        ("begin", 0),
        ("end", 0),
        ("begin", 1),
        ("end", 1),
    ]
    ends = [v for k, _, v in parts if k == "end"]
    assert [(c["id"], c["function"]["arguments"]) for c in ends][0] == ("call_model", '{"x": 1}')
    assert ends[1]["function"] == {"name": "b", "arguments": '{"y": [2]}'}
    # parallel_tool_calls false
    assert [v for k, _, v in read(list(one + two), single=True) if k == "end"] == ends[:1]
    no_args = read(list('<tool_call>{"name": "c"}</tool_call>'))
    check_streamed(no_args, "", "{}", name="c")


def test_a_call_cut_off_keeps_what_was_sent():
    parts = read(list('<tool_call>{"name": "f", "arguments": {"city": "Par'))
    check_streamed(parts, "", '{"city": "Par', name="f")


# -- the dialects, through the SDKs' stream helpers
# -------------------------------------------------


def test_openai_chat_stream_helper(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=ANSWER)
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": WEATHER, "strict": True},
        }
    ]
    with client(engine, tool_served) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        whole = (
            oa.chat.completions.create(model=MODEL, messages=QUESTION, tools=tools)
            .choices[0]
            .message
        )
        with oa.chat.completions.stream(model=MODEL, messages=QUESTION, tools=tools) as s:
            events = list(s)
            final = s.get_final_completion().choices[0]
    deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(deltas) > 20 and "".join(e.arguments_delta for e in deltas) == WANT
    # the partial JSON, as it grew
    assert deltas[-1].parsed_arguments == ARGS and deltas[3].parsed_arguments != ARGS
    [done] = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert done.arguments == WANT and done.parsed_arguments == ARGS
    [call] = final.message.tool_calls
    assert (
        call.function.arguments == whole.tool_calls[0].function.arguments == WANT
        and final.finish_reason == "tool_calls"
    )
    assert final.message.content == "Let me check. " and whole.content == "Let me check."


def test_anthropic_stream_helper(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=ANSWER)
    tools = [{"name": "get_weather", "input_schema": WEATHER}]
    with client(engine, tool_served) as http:
        ant = anthropic.Anthropic(
            base_url="http://testserver", api_key="unused", max_retries=0, http_client=http
        )
        whole = ant.messages.create(model=MODEL, max_tokens=500, messages=QUESTION, tools=tools)
        with ant.messages.stream(model=MODEL, max_tokens=500, messages=QUESTION, tools=tools) as s:
            events = list(s)
            final = s.get_final_message()
    partial = [e for e in events if e.type == "input_json"]
    assert (
        len(partial) > 20
        and "".join(e.partial_json for e in partial) == WANT
        and partial[-1].snapshot == ARGS
    )
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["text", "tool_use"] and starts[1].input == {}
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("text", None),
        ("tool_use", ARGS),
    ]
    assert (
        final.content[1].id.startswith("toolu_")
        and final.stop_reason == whole.stop_reason == "tool_use"
    )
    assert whole.content[1].input == ARGS


def test_responses_stream_helper(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=ANSWER)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
    with client(engine, tool_served) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        whole = oa.responses.create(model=MODEL, input=QUESTION, tools=tools)
        with oa.responses.stream(model=MODEL, input=QUESTION, tools=tools) as s:
            events = list(s)
            final = s.get_final_response()
    names = [e.type for e in events]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [i.type for i in added] == ["message", "function_call"] and added[1].arguments == ""
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert (
        len(deltas) > 20
        and {e.item_id for e in deltas} == {added[1].id}
        and "".join(e.delta for e in deltas) == WANT
    )
    tail = names[names.index("response.function_call_arguments.done") :]
    assert tail == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = final.output[1]
    assert (call.type, call.id, call.arguments) == (
        "function_call",
        added[1].id,
        WANT,
    ) and whole.output[1].arguments == WANT
