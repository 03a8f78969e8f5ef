"""The messages of an Anthropic Messages request: their content blocks, checked (images and
documents refused where they are), and the conversation as the internal request's chat messages."""

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlx_ring.api.schema import Refused, _Strict


class _Block(_Strict):
    cache_control: dict | None = Field(
        None, description="Accepted and ignored: the prompt cache finds shared prefixes itself."
    )


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list | None = None


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class MediaBlock(Refused):
    """Images and documents: recognised only to be refused, with a message that
    says where and why."""

    type: Literal["image", "document"]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | MediaBlock, Field(discriminator="type")]] | None = (
        None
    )
    is_error: bool | None = None

    def text(self) -> str:
        text = (
            self.content
            if isinstance(self.content, str)
            else "".join(b.text for b in self.content or [])
        )
        return f"Error: {text}" if self.is_error else text


class OtherBlock(BaseModel):
    """Blocks dropped: earlier thinking, which this server does not do."""

    model_config = ConfigDict(extra="allow")
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | MediaBlock | OtherBlock,
    Field(discriminator="type"),
]


def media_block(messages: list["Message"]) -> str | None:
    """Where the first image or document block is (`messages.4.content.0.content.1`), else None."""
    for i, m in enumerate(messages):
        for j, b in enumerate(m.content if isinstance(m.content, list) else []):
            inner = b.content if b.type == "tool_result" and isinstance(b.content, list) else []
            found = [(f"messages.{i}.content.{j}", b)] + [
                (f"messages.{i}.content.{j}.content.{k}", c) for k, c in enumerate(inner)
            ]
            for where, block in found:
                if isinstance(block, MediaBlock):
                    return (
                        f"{where}: {block.type} blocks are not supported by this text "
                        "model; send text blocks"
                    )
    return None


def _blocks_but(*kinds: str) -> dict:
    """JSON Schema: text, or blocks none of whose type is one of `kinds`."""
    return {
        "properties": {
            "content": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {
                            "not": {
                                "required": ["type"],
                                "properties": {"type": {"enum": list(kinds)}},
                            }
                        },
                    },
                ]
            }
        }
    }


class Message(_Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"if": {"properties": {"role": {"const": role}}}, "then": _blocks_but(*kinds)}
                for role, kinds in (
                    ("user", ["tool_use"]),
                    ("assistant", ["tool_result"]),
                    (
                        "system",
                        [
                            "tool_use",
                            "tool_result",
                            "thinking",
                            "redacted_thinking",
                            "image",
                            "document",
                        ],
                    ),
                )
            ]
        }
    )
    # "system": an instruction within the conversation, as Claude Code sends them
    # (mid-conversation-system beta)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _check(self):
        for b in self.content if isinstance(self.content, list) else []:
            if self.role == "system" and b.type != "text":
                raise ValueError("system messages hold text blocks only")
            if b.type == "tool_use" and self.role != "assistant":
                raise ValueError("tool_use blocks belong in assistant messages")
            if b.type == "tool_result" and self.role != "user":
                raise ValueError("tool_result blocks belong in user messages")
        return self


def chat_messages(system: str, messages: list[Message]) -> list[dict]:
    """Anthropic's conversation as chat messages: tool results become tool messages (before the
    user's text that came with them), an assistant's tool_use blocks its tool calls."""
    out = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls = [], []
        for b in m.content:
            if b.type == "text":
                texts.append(b.text)
            elif b.type == "tool_use":
                calls.append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": b.name, "arguments": json.dumps(b.input)},
                    }
                )
            elif b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
        if m.role == "assistant":
            out.append(
                {"role": "assistant", "content": "".join(texts)}
                | ({"tool_calls": calls} if calls else {})
            )
        elif texts or not any(b.type == "tool_result" for b in m.content):
            out.append({"role": m.role, "content": "".join(texts)})
    return out
