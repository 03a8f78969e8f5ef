"""The Responses API's input items (messages, calls and their outputs) and tools, checked (media
parts refused where they are), and the input as the internal request's chat messages."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from mlx_ring.api import custom_tools
from mlx_ring.api.custom_tools import CustomTool, ToolSearchOutputItem, ToolSearchTool
from mlx_ring.api.schema import NAME, Refused, _Strict


class TextContent(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list | None = None
    logprobs: list | None = None


class MediaContent(Refused):
    """Recognised only to be refused with a clear message."""

    type: Literal["input_image", "input_file", "input_audio"]


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[TextContent | MediaContent, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool whose function this is
    id: str | None = None
    status: str | None = None

    def message_call(self) -> dict:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": flat(self.namespace, self.name), "arguments": self.arguments},
        }


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[Annotated[TextContent | MediaContent, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamespaceTool(_Strict):
    """Function tools under one name, as Codex groups some of its tools; the model sees each as
    `namespace__name`, and its calls come back with `name` and `namespace` apart."""

    type: Literal["namespace"]
    name: str = Field(pattern=NAME)
    description: str | None = None
    tools: list[FunctionTool] = Field(min_length=1, max_length=128)


class WebSearchTool(BaseModel):
    """A hosted tool this server does not run: accepted, as a model that never calls it is still
    answered by the real API (Codex sends one by default), and not offered to the model."""

    model_config = ConfigDict(extra="allow")
    type: Literal["web_search", "web_search_preview"]


HOSTED_NOT_RUN = ("web_search", "web_search_preview")


Tool = Annotated[
    FunctionTool | NamespaceTool | WebSearchTool | CustomTool | ToolSearchTool,
    Field(discriminator="type"),
]


class ToolSearchOutput(ToolSearchOutputItem):
    tools: list[Tool]  # the tools a client's search loaded, as the request's own tools


def _item_type(v) -> str:
    return (v.get("type") if isinstance(v, dict) else getattr(v, "type", None)) or "message"


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[FunctionCallOutputItem, Tag("custom_tool_call_output")]
    | custom_tools.CALL_ITEMS
    | Annotated[ToolSearchOutput, Tag("tool_search_output")],
    Discriminator(_item_type),
]


def media_part(items) -> str | None:
    """Where the first image, file or audio part of the input is (`input.3.output.0`), else None."""
    for i, it in enumerate(items if isinstance(items, list) else []):
        parts = (
            getattr(it, "content", None)
            if isinstance(it, MessageItem)
            else getattr(it, "output", None)
        )
        for j, p in enumerate(parts if isinstance(parts, list) else []):
            if isinstance(p, MediaContent):
                where = f"input.{i}.{'content' if isinstance(it, MessageItem) else 'output'}.{j}"
                return (
                    f"{where}: {p.type} parts are not supported by this text model; send input_text"
                )
    return None


def flat(namespace: str | None, name: str) -> str:
    """A namespaced function's name as the model sees it."""
    return f"{namespace}__{name}" if namespace else name


def input_messages(items: str | list) -> list[dict]:
    """Input items as chat messages: function calls join the assistant turn before them, their
    outputs become tool messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out = []
    for it in items:
        if isinstance(it, MessageItem):
            out.append({"role": it.role, "content": it.text()})
        elif hasattr(it, "message_call"):  # a function, custom or tool_search call
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(it.message_call())
        elif hasattr(it, "message"):  # a tool_search's output
            out.append(it.message())
        else:
            out.append({"role": "tool", "tool_call_id": it.call_id, "content": it.text()})
    return out
