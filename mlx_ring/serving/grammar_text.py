"""The text of the grammars a constrained answer is decoded under (JSON, a JSON schema, a
forced tool call, tool calls within free text), in llguidance's format. No MLX here: the
HTTP side builds them (api/chat.py, api/custom_tools.py), and serving/grammar.py enforces
them on the engine thread."""

import json

from llguidance import LLMatcher

# Compact JSON with the usual separators: free whitespace lets a weak model pad until max_tokens.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema: dict | None) -> str:
    """A grammar for a JSON value matching `schema` (None: any JSON object)."""
    return LLMatcher.grammar_from_json_schema(
        schema if schema is not None else {"type": "object"}, defaults=JSON_STYLE
    )


def tool_call_grammar(tools: list[dict], start: str, end: str) -> str:
    """A grammar for one call of one of `tools` (OpenAI tool dicts) between the template's
    markers, as the json_tools family writes it: `<tool_call>\\n{"name": ..., "arguments":
    {...}}\\n</tool_call>`."""
    calls = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "arguments"],
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
        }
        for t in tools
    ]
    schema = (calls[0] if len(calls) == 1 else {"anyOf": calls}) | {"x-guidance": JSON_STYLE}
    return LLMatcher.grammar_from_lark(
        f"start: {json.dumps(start + chr(10))} call {json.dumps(chr(10) + end)}\n"
        f"call: %json {json.dumps(schema)}\n"
    )


def calls_in_text_grammar(calls: list[dict], start: str, end: str) -> str:
    """A grammar for free text in which each tool call, once the model opens one with the template's
    start marker, is one of `calls` (JSON schemas of the call object) up to the end marker, as the
    json_tools family writes it; any number of calls, text between them, or none."""
    schema = (calls[0] if len(calls) == 1 else {"anyOf": calls}) | {"x-guidance": JSON_STYLE}
    return LLMatcher.grammar_from_lark(
        "start: call* rest\nrest: TEXT\nTEXT: /(.|\\n)*/\nhead[lazy]: TEXT "
        f"{json.dumps(start + chr(10))}\ncall: head body {json.dumps(chr(10) + end)}\nbody: %json "
        f"{json.dumps(schema)}\n"
    )
