"""A chat request's extras without a ring: tool calls found in streamed text by mlx-lm's parser,
the lenient fields, the parts and tool messages the schema takes, grammars llguidance checks."""

import json
import subprocess
import sys

import pytest
from mlx_lm.tool_parsers import json_tools
from pydantic import ValidationError

from mlx_ring.api.openai_request import ChatCompletionRequest
from mlx_ring.api.toolcalls import ToolCallText
from mlx_ring.serving.grammar_text import json_grammar, tool_call_grammar

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


def splitter(single=False):
    return ToolCallText("<tool_call>", "</tool_call>", json_tools.parse_tool_call, TOOLS, single)


def run(text: str, pieces: int, single=False):
    """Feed `text` in pieces of `pieces` characters (markers split across pieces too)."""
    t = splitter(single)
    parts = [
        p for i in range(0, len(text), pieces) for p in t.feed(text[i : i + pieces])
    ] + t.finish()
    return "".join(v for k, _, v in parts if k == "text"), [v for k, _, v in parts if k == "call"]


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("pieces", [1, 3, 7, 1000])
def test_tool_calls_come_out_of_text_however_it_is_split(pieces):
    content, calls = run("Let me look. " + CALL + "\n" + CALL.replace("Paris", "Oslo"), pieces)
    assert content == "Let me look. \n"
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Oslo"},
    ]
    assert all(
        c["type"] == "function"
        and c["function"]["name"] == "get_weather"
        and c["id"].startswith("call_")
        for c in calls
    )


def test_an_unclosed_call_is_parsed_and_text_that_does_not_parse_stays():
    # the model stopped right after the call
    assert len(run(CALL.removesuffix("</tool_call>"), 5)[1]) == 1
    content, calls = run("<tool_call>not json</tool_call> and <tool_c", 4)
    assert calls == [] and content == "<tool_call>not json</tool_call> and <tool_c"
    assert len(run(CALL + CALL, 10, single=True)[1]) == 1  # parallel_tool_calls false


def chat(**fields):
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_harmless_fields_are_accepted_and_unknown_ones_refused():
    chat(
        store=True,
        metadata={"k": "v"},
        user="u",
        service_tier="auto",
        prompt_cache_key="p",
        safety_identifier="s",
        parallel_tool_calls=False,
        tools=TOOLS,
        n=8,
        response_format={"type": "text"},
    )
    with pytest.raises(ValidationError, match="audio"):
        chat(audio={"voice": "x"})
    with pytest.raises(ValidationError):
        chat(n=9)


def test_parts_tool_messages_and_tool_choice():
    chat(
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    with pytest.raises(
        ValidationError, match="image_url parts are not supported: this model reads text only"
    ):
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ]
        )
    turns = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    chat(messages=turns, tools=TOOLS)
    with pytest.raises(ValidationError, match="tool_call_id"):
        chat(messages=[{"role": "tool", "content": "sunny"}])
    with pytest.raises(ValidationError, match="only allowed when tools are given"):
        chat(tool_choice="required")
    with pytest.raises(ValidationError, match="not one of the tools"):
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "other"}})
    assert [t.function.name for t in chat(tools=TOOLS, tool_choice="required").forced_tools()] == [
        "get_weather"
    ]
    assert chat(tools=TOOLS, tool_choice="none").offered_tools() == []


def test_grammars_compile_and_name_what_they_cannot_enforce():
    assert '"properties"' in json_grammar(
        {"type": "object", "properties": {"a": {"type": "integer"}}}
    )
    assert "<tool_call>" in tool_call_grammar(TOOLS, "<tool_call>", "</tool_call>")


def test_the_http_side_builds_grammars_without_mlx():
    """The app, its adapters and the grammar text load no MLX, so the body readers' worker processes
    (api/bodies.py) start without it and nothing on the HTTP side can touch the engine's device."""
    code = (
        "import sys, mlx_ring.api.app; print(sorted(m for m in sys.modules if "
        "m.split('.')[0] == 'mlx'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
