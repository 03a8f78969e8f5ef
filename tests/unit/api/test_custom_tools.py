"""The Responses API's custom (free-form) tools and client-run tool search, through the official
`openai` SDK against the stand-in engine under the tools template: a custom call comes back as
`custom_tool_call` whole and streamed (`response.custom_tool_call_input.delta` / `.done`) and
reads back with its output; a forced call is decoded under its Lark or regex grammar (checked
with llguidance itself); tool_search run by the client comes back as `tool_search_call`, and the
tools its output loads are offered."""

import json
import re

import openai
import pytest
from apiutil import CALL, MODEL, WEATHER, FakeEngine, client, templated
from llguidance import LLMatcher

from mlx_ring.api.lark_regex import lark_to_regex

# Codex 0.171's apply_patch grammar, as its request carries it
# (tests/data/clients/codex_0.171_gpt55_responses.json)
LARK = json.loads(
    (
        __import__("pathlib").Path(__file__).parents[2]
        / "data"
        / "clients"
        / "codex_0.171_gpt55_responses.json"
    ).read_text()
)["body"]["tools"][3]["format"]["definition"]
PATCH = (
    '*** Begin Patch\n*** Update File: hello.py\n@@ def hello():\n-    print("hi")\n+    '
    'print("hello")\n*** End Patch\n'
)
TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
QUESTION = "Make hello.py say hello"


def call_text(name: str, args) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def sdk(http) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
    )


def test_the_apply_patch_grammar_as_one_regular_expression():
    rx = lark_to_regex(LARK)
    assert re.fullmatch(rx, PATCH) and re.fullmatch(
        rx, "*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n*** End Patch"
    )
    assert not re.fullmatch(rx, PATCH.replace("*** End Patch\n", "")) and not re.fullmatch(
        rx, "*** Begin Patch\n*** End Patch\n"
    )
    assert re.fullmatch(
        lark_to_regex(
            'start: "a".."c"+ WORD~2 [NUM] "q"i\nNUM: DIGIT{1,3} -> n\n%import common (WORD, DIGIT)'
        ),
        "abcxyzxyz12Q",
    )
    for grammar, why in [
        ('start: a\na: "x" a?', "refers to itself"),
        ('start: "a"\n%ignore " "', "%ignore is not supported"),
        ('start: "a" b', "uses b, which it does not define"),
        ('expr: "a"', "no start rule"),
    ]:
        with pytest.raises(ValueError, match=why):
            lark_to_regex(grammar)


def test_a_custom_tool_call_whole_streamed_and_its_output(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=call_text("apply_patch", {"input": PATCH}))
    with client(engine, tool_served) as http:
        oa = sdk(http)
        r = oa.responses.create(model=MODEL, input=QUESTION, tools=[TOOL])
        [call] = r.output
        assert (call.type, call.name, call.input, call.status) == (
            "custom_tool_call",
            "apply_patch",
            PATCH,
            "completed",
        )
        assert call.call_id.startswith("call_") and r.tools[0].type == "custom"
        # the template shows a function taking one string, its grammar in
        # the parameter's description
        prompt = tool_served.tokenizer.decode(engine.submitted[0][0].prompt)
        assert (
            '"name": "apply_patch"' in prompt
            and '"input"' in prompt
            and "begin_patch hunk+ end_patch" in prompt
        )
        events = list(oa.responses.create(model=MODEL, input=QUESTION, tools=[TOOL], stream=True))
        types = [e.type for e in events]
        deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        assert len(deltas) > 1 and "".join(deltas) == PATCH  # the input as it is generated
        [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert done.input == PATCH and "response.function_call_arguments.delta" not in types
        added = next(e for e in events if e.type == "response.output_item.added")
        assert (added.item.type, added.item.input, added.item.status) == (
            "custom_tool_call",
            "",
            "in_progress",
        )
        assert (
            len(
                {e.item_id for e in events if e.type.startswith("response.custom_tool_call_input")}
                | {added.item.id}
            )
            == 1
        )
        assert (
            events[-1].type == "response.completed" and events[-1].response.output[0].input == PATCH
        )
        # the SDK's accumulating helper
        with oa.responses.stream(model=MODEL, input=QUESTION, tools=[TOOL]) as s:
            assert s.get_final_response().output[0].input == PATCH
        # the next turn sends the call back with its output
        engine.answer = "Done."
        turn = [
            {"role": "user", "content": QUESTION},
            call.model_dump(exclude_none=True),
            {
                "type": "custom_tool_call_output",
                "call_id": call.call_id,
                "output": "Success. Updated hello.py",
            },
        ]
        assert oa.responses.create(model=MODEL, input=turn, tools=[TOOL]).output_text == "Done."
        function = {
            "name": "apply_patch",
            "description": "Edit files with a patch",
            "parameters": {
                "type": "object",
                "properties": {
                    "input": {
                        "type": "string",
                        "description": f"The tool's input, as text in this lark grammar:\n{LARK}",
                    }
                },
                "required": ["input"],
                "additionalProperties": False,
            },
        }
        chat = [
            {"role": "user", "content": QUESTION},
            # an answer of this server's comes back as the model wrote it
            {"role": "assistant", "content": call_text("apply_patch", {"input": PATCH})},
            {"role": "tool", "tool_call_id": call.call_id, "content": "Success. Updated hello.py"},
        ]
        assert engine.submitted[-1][0].prompt == templated(
            tool_served, chat, tools=[{"type": "function", "function": function}]
        )


def accepts(served, grammar: str, text: str) -> bool:
    """Whether llguidance, under `grammar`, lets the model write `text` whole."""
    matcher = LLMatcher(served.grammars.tokenizer, grammar, log_level=0)
    return (
        all(
            matcher.consume_token(t)
            for t in served.tokenizer.encode(text, add_special_tokens=False)
        )
        and matcher.is_accepting()
    )


def test_with_tool_choice_auto_a_call_is_decoded_under_its_grammar(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=call_text("apply_patch", {"input": PATCH}))
    weather = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    with client(engine, tool_served) as http:
        oa = sdk(http)
        assert (
            oa.responses.create(model=MODEL, input=QUESTION, tools=[weather, TOOL]).output[0].input
            == PATCH
        )
        grammar = engine.submitted[-1][0].params.grammar
        # words, calls, words and calls: the model chooses; a call it opens is whole, its
        # input in the grammar
        for fine in [
            engine.answer,
            "I cannot edit files.",
            "Here:\n" + engine.answer,
            engine.answer + "\n" + CALL,
            CALL,
        ]:
            assert accepts(tool_served, grammar, fine), fine
        for broken in [
            call_text("apply_patch", {"input": "*** Begin Patch\nrm -rf /\n*** End Patch\n"}),
            call_text("apply_patch", {"patch": PATCH}),
            call_text("delete_files", {}),
            "<tool_call>\nnot JSON\n</tool_call>",
        ]:
            assert not accepts(tool_served, grammar, broken), broken
        recursive = TOOL | {
            "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "(" start? ")"'}
        }
        oa.responses.create(
            model=MODEL,
            input=QUESTION,
            tools=[weather, recursive, {"type": "custom", "name": "note"}],
        )
        # no grammar it can hold: calls stay free
        assert engine.submitted[-1][0].params.grammar is None
        oa.responses.create(model=MODEL, input=QUESTION, tools=[weather, TOOL], tool_choice="none")
        assert engine.submitted[-1][0].params.grammar is None


def test_a_forced_custom_call_is_decoded_under_its_grammar(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=call_text("apply_patch", {"input": PATCH}))
    regex = {
        "type": "custom",
        "name": "version",
        "format": {"type": "grammar", "syntax": "regex", "definition": r"v[0-9]+\.[0-9]+"},
    }
    with client(engine, tool_served) as http:
        oa = sdk(http)
        r = oa.responses.create(
            model=MODEL,
            input=QUESTION,
            tools=[TOOL, regex],
            tool_choice={"type": "custom", "name": "apply_patch"},
        )
        assert r.output[0].input == PATCH and r.tool_choice.name == "apply_patch"
        grammar = engine.submitted[-1][0].params.grammar
        assert accepts(tool_served, grammar, engine.answer)
        assert not accepts(
            tool_served,
            grammar,
            call_text("apply_patch", {"input": PATCH.replace("*** End Patch", "*** Stop")}),
        )
        # the named tool only
        assert not accepts(tool_served, grammar, call_text("version", {"input": "v1.2"}))
        oa.responses.create(
            model=MODEL, input=QUESTION, tools=[TOOL, regex], tool_choice="required"
        )
        grammar = engine.submitted[-1][0].params.grammar
        assert accepts(tool_served, grammar, call_text("version", {"input": "v1.2"})) and accepts(
            tool_served, grammar, engine.answer
        )
        assert not accepts(tool_served, grammar, call_text("version", {"input": "v1.2 or so"}))
        # a grammar decoding cannot hold inside the call's JSON is refused when the call
        # is forced, by name
        recursive = TOOL | {
            "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "(" start? ")"'}
        }
        with pytest.raises(
            openai.BadRequestError,
            match="tool_choice: the call to apply_patch cannot be decoded under its grammar",
        ):
            oa.responses.create(
                model=MODEL, input=QUESTION, tools=[recursive], tool_choice="required"
            )
        # auto: offered
        assert (
            oa.responses.create(model=MODEL, input=QUESTION, tools=[recursive]).output[0].input
            == PATCH
        )
        with pytest.raises(openai.BadRequestError, match="tools.0.custom.format.grammar.syntax"):
            oa.responses.create(
                model=MODEL,
                input=QUESTION,
                tools=[TOOL | {"format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}],
            )


def test_tool_search_run_by_the_client_loads_tools(tool_served):
    search = {
        "type": "tool_search",
        "execution": "client",
        "description": "Find more tools",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
    engine = FakeEngine(
        tool_served.tokenizer, answer=call_text("tool_search", {"query": "weather"})
    )
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER,
    }
    with client(engine, tool_served) as http:
        oa = sdk(http)
        r = oa.responses.create(model=MODEL, input="Weather in Paris?", tools=[search])
        [call] = r.output
        assert (call.type, call.arguments, call.execution) == (
            "tool_search_call",
            {"query": "weather"},
            "client",
        )
        assert "Find more tools" in tool_served.tokenizer.decode(engine.submitted[-1][0].prompt)
        engine.answer = CALL
        turn = [
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_none=True),
            {
                "type": "tool_search_output",
                "call_id": call.call_id,
                "execution": "client",
                "tools": [weather],
            },
        ]
        r = oa.responses.create(model=MODEL, input=turn, tools=[search])
        # the loaded tool, offered
        assert (r.output[0].type, r.output[0].name) == ("function_call", "get_weather")
        assert "The weather in a city" in tool_served.tokenizer.decode(
            engine.submitted[-1][0].prompt
        )
        with pytest.raises(
            openai.BadRequestError,
            match="tools.0: tool_search run by the server is not supported by this server",
        ):
            oa.responses.create(
                model=MODEL, input="Weather in Paris?", tools=[{"type": "tool_search"}]
            )
