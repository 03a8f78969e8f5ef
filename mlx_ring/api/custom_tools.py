"""The Responses API's tools beside functions that the client runs: `custom` (free-form text
input, optionally in a Lark or regex grammar, as Codex's apply_patch) and a client-executed
`tool_search`. The chat template sees each as a function (a custom tool takes one string,
`input`); the model's call comes back as the item the real API gives (`custom_tool_call` with its
`input` text, `tool_search_call` with its `arguments`), and those items and their outputs read
back in the next turn as calls and tool results. A forced custom call's input is decoded under
its grammar (llguidance escapes a JSON string's pattern, so a Lark grammar is turned into one
regular expression first)."""

import json
import uuid
from typing import Annotated, Literal

from pydantic import Field, Tag

from mlx_ring.api.lark_regex import lark_to_regex
from mlx_ring.api.schema import NAME, _Strict
from mlx_ring.api.toolcalls import _scan_string
from mlx_ring.serving.grammar_text import calls_in_text_grammar

INPUT_START = '{"input": "'  # a custom call's arguments as the parsers give them, up to its text
SEARCH = "tool_search"


class TextInput(_Strict):
    type: Literal["text"]


class GrammarInput(_Strict):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: str = Field(min_length=1)

    def pattern(self) -> str:
        """The grammar as one anchored regular expression, for a JSON string's `pattern`."""
        return (
            lark_to_regex(self.definition) if self.syntax == "lark" else f"^(?:{self.definition})$"
        )


class CustomTool(_Strict):
    type: Literal["custom"]
    name: str = Field(pattern=NAME)
    description: str | None = None
    format: Annotated[TextInput | GrammarInput, Field(discriminator="type")] | None = None

    def function(self, forced: bool) -> dict:
        """The function the chat template shows: one string parameter, `input`; under
        `forced` (the answer must call it) the input's schema carries the grammar's
        pattern, which decoding enforces."""
        fmt = self.format if isinstance(self.format, GrammarInput) else None
        text = {
            "type": "string",
            "description": (
                f"The tool's input, as text in this {fmt.syntax} grammar:\n{fmt.definition}"
                if fmt
                else "The tool's input, as free text"
            ),
        }
        if fmt and forced:
            try:
                text["pattern"] = fmt.pattern()
            except ValueError as e:
                raise ValueError(
                    f"tool_choice: the call to {self.name} cannot be decoded under its grammar: "
                    f"{e}; use tool_choice auto, or a grammar without recursion"
                ) from None
        params = {
            "type": "object",
            "properties": {"input": text},
            "required": ["input"],
            "additionalProperties": False,
        }
        return (
            {"name": self.name}
            | ({"description": self.description} if self.description else {})
            | {"parameters": params}
        )


class ToolSearchTool(_Strict):
    """Tool search run by the client (`execution: client`, as Codex sends it): a
    function to the model."""

    type: Literal["tool_search"]
    execution: Literal["client"]
    description: str | None = None
    parameters: dict | None = None

    @property
    def name(self) -> str:
        return SEARCH

    def function(self, forced: bool) -> dict:
        return (
            {"name": SEARCH}
            | ({"description": self.description} if self.description else {})
            | {
                "parameters": self.parameters
                or {"type": "object", "properties": {"query": {"type": "string"}}}
            }
        )


def hosted_search_refused(data):
    """`data` unless a tool_search in it is to be run by the server (a search over tools this server
    does not hold)."""
    tools = data.get("tools") if isinstance(data, dict) else None
    # any other shape: validation names it
    for i, t in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(t, dict) and t.get("type") == SEARCH and t.get("execution") != "client":
            raise ValueError(
                f"tools.{i}: tool_search run by the server is not supported by this server: it "
                "holds no deferred tools to search; send execution: client (with parameters) to "
                "run the search yourself"
            )
    return data


class ToolChoiceCustom(_Strict):
    type: Literal["custom"]
    name: str


class CustomToolCallItem(_Strict):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None

    def message_call(self) -> dict:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps({"input": self.input})},
        }


class ToolSearchCallItem(_Strict):
    type: Literal["tool_search_call"]
    arguments: dict
    call_id: str | None = None
    execution: Literal["client"] = "client"
    id: str | None = None
    status: str | None = None

    def message_call(self) -> dict:
        return {
            "id": self.call_id or self.id or "",
            "type": "function",
            "function": {"name": SEARCH, "arguments": json.dumps(self.arguments)},
        }


class ToolSearchOutputItem(_Strict):
    """The tools a client's search loaded: offered to the model from this turn on (the Responses
    API's module types `tools` as its own tools)."""

    type: Literal["tool_search_output"]
    tools: list
    call_id: str | None = None
    execution: Literal["client"] = "client"
    id: str | None = None
    status: str | None = None

    def message(self) -> dict:
        names = [getattr(t, "name", None) for t in self.tools]
        return {
            "role": "tool",
            "tool_call_id": self.call_id or self.id or "",
            "content": json.dumps({"tools": names}) if names else "no tools found",
        }


# the input items of these tools' calls, for the Responses API's item union
CALL_ITEMS = (
    Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[ToolSearchCallItem, Tag("tool_search_call")]
)


def check_forced(tools: list | None, choice) -> None:
    """A forced custom call's grammar must be one decoding can enforce
    (raises ValueError if not)."""
    for t in tools or []:
        if isinstance(t, CustomTool) and (
            choice == "required" or (isinstance(choice, ToolChoiceCustom) and choice.name == t.name)
        ):
            t.function(forced=True)


def loaded_tools(data):
    """`data` with the tools that `tool_search_output` input items loaded added to its `tools`
    (data of any other shape as it came, for validation to name what is wrong)."""
    items, tools = (
        (data.get("input"), data.get("tools") or []) if isinstance(data, dict) else (None, None)
    )
    if not isinstance(items, list) or not isinstance(tools, list):
        return data
    loaded = [
        t
        for it in items
        if isinstance(it, dict)
        and it.get("type") == "tool_search_output"
        and isinstance(it.get("tools"), list)
        for t in it["tools"]
    ]
    if not loaded:
        return data

    def name(t) -> str | None:
        return t.get("name") if isinstance(t, dict) and isinstance(t.get("name"), str) else None

    have = {name(t) for t in tools} - {None}
    return data | {"tools": tools + [t for t in loaded if name(t) not in have]}


def client_tools(tools: list) -> dict[str, CustomTool | ToolSearchTool]:
    """The model's function names of the custom and tool_search tools among `tools`."""
    return {t.name: t for t in tools or [] if isinstance(t, (CustomTool, ToolSearchTool))}


def constrain_calls(chat, tools: list | None) -> None:
    """With tool_choice auto, a custom tool's grammar still holds wherever the model calls it (as
    the real API's does): the answer is free text in which each call's arguments are an object,
    and a custom call's input matches its grammar. A grammar that cannot be one regular
    expression leaves its input free."""
    fmt = chat.response_format
    if chat.tool_choice not in (None, "auto") or (fmt is not None and fmt.type != "text"):
        return
    patterns = {}
    for t in tools or []:
        if isinstance(t, CustomTool) and isinstance(t.format, GrammarInput):
            try:
                patterns[t.name] = t.format.pattern()
            except ValueError:
                continue
    if not patterns:
        return
    calls = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "arguments"],
            "properties": {
                "name": {"const": t.function.name},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "input": {"type": "string", "pattern": patterns[t.function.name]}
                    },
                    "required": ["input"],
                    "additionalProperties": False,
                }
                if t.function.name in patterns
                else {"type": "object"},
            },
        }
        for t in chat.offered_tools()
    ]
    chat.constrain_calls(lambda start, end: calls_in_text_grammar(calls, start, end))


def custom_input(arguments: str) -> str:
    """A custom call's input from the arguments the model wrote ({"input": ...}; any other JSON
    as it came)."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(args, dict) and isinstance(args.get("input"), str):
        return args["input"]
    return args if isinstance(args, str) else arguments


def output_item(call: dict, tool: CustomTool | ToolSearchTool, status: str = "completed") -> dict:
    """A parsed call (OpenAI's chat shape) of a custom or tool_search tool as
    the Responses API's item."""
    done, args = status == "completed", call["function"]["arguments"]
    if isinstance(tool, CustomTool):
        return {
            "type": "custom_tool_call",
            "id": f"ctc_{uuid.uuid4().hex[:24]}",
            "call_id": call["id"],
            "name": tool.name,
            "input": custom_input(args) if done else "",
            "status": status,
        }
    try:
        arguments = json.loads(args) if done else {}
    except json.JSONDecodeError:
        arguments = {"query": args}
    return {
        "type": "tool_search_call",
        "id": f"tsc_{uuid.uuid4().hex[:24]}",
        "call_id": call["id"],
        "execution": "client",
        "arguments": arguments,
        "status": status,
    }


class InputStream:
    """A custom call's input text as its arguments' JSON streams in: each fragment of `{"input":
    "...` gives the text it completes (never half an escape)."""

    def __init__(self):
        self.raw, self.sent = "", 0

    def feed(self, fragment: str) -> str:
        self.raw += fragment
        if not self.raw.startswith(INPUT_START):
            return ""
        safe, end = _scan_string(self.raw, len(INPUT_START))
        try:
            text = json.loads('"' + self.raw[len(INPUT_START) : end if end >= 0 else safe] + '"')
        except ValueError:
            return ""
        new, self.sent = text[self.sent :], len(text)
        return new


class ArgumentStream:
    """An open call's argument fragments as the deltas of its stream's events (`event`.delta,
    then `event`.done naming the item's `field`): a function's arguments as they come, a custom
    tool's input text as it completes, none for a tool search (its item has no such events)."""

    EVENTS = {
        "function_call": ("response.function_call_arguments", "arguments"),
        "custom_tool_call": ("response.custom_tool_call_input", "input"),
    }

    def __init__(self, item_type: str):
        self.event, self.field = self.EVENTS.get(item_type, (None, None))
        self.input = InputStream() if item_type == "custom_tool_call" else None

    def feed(self, fragment: str) -> str:
        if self.event is None:
            return ""
        return self.input.feed(fragment) if self.input else fragment
