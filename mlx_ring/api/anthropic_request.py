"""Anthropic's typed requests (`/v1/messages` and its `count_tokens`): tools, tool choice, thinking
and output format, checked, and their fields as the internal chat request's."""

from typing import Annotated, ClassVar, Literal

from pydantic import Field, WithJsonSchema, model_validator

from mlx_ring.api.anthropic_messages import Message, TextBlock, chat_messages, media_block
from mlx_ring.api.dialects import check_tool_choice
from mlx_ring.api.schema import NAME, _Strict, bounds_of, hosted_tools_refused


class ToolDef(_Strict):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=NAME)
    description: str | None = None
    input_schema: dict = Field(description="A JSON Schema of the tool's input object.")
    cache_control: dict | None = None


class _Choice(_Strict):
    disable_parallel_tool_use: bool | None = None


class AutoChoice(_Choice):
    type: Literal["auto"]


class AnyChoice(_Choice):
    type: Literal["any"]


class ToolChoiceNamed(_Choice):
    type: Literal["tool"]
    name: str


class NoneChoice(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    AutoChoice | AnyChoice | ToolChoiceNamed | NoneChoice, Field(discriminator="type")
]


class Metadata(_Strict):
    user_id: str | None = None


class CacheControl(_Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1024)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


Thinking = Annotated[
    ThinkingDisabled | ThinkingEnabled | ThinkingAdaptive, Field(discriminator="type")
]


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict = Field(
        alias="schema", description="A JSON Schema; the answer is decoded to match it."
    )


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="Accepted and ignored."
    )
    format: JsonOutputFormat | None = None


# Claude Code's first system block: its version, entry point and (newer versions) a `cch=` value
# that changes every request. It means nothing to a local model, and left in, every turn's prompt
# would differ from its first tokens on, so no turn could reuse the last one's prompt cache.
BILLING_LINE = "x-anthropic-billing-header:"


def drop_billing_line(text: str) -> str:
    """`text` without a leading billing line (and the line break after it)."""
    if not text.lstrip().startswith(BILLING_LINE):
        return text
    _, _, rest = text.lstrip().partition("\n")
    return rest


class CountTokensRequest(_Strict):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    # Accepted: this model answers without a thinking phase, so enabled or adaptive thinking gives a
    # message with no thinking blocks (Claude Code asks for thinking by default).
    thinking: Thinking | None = None
    cache_control: CacheControl | None = Field(
        None, description="Accepted and ignored: the prompt cache finds shared prefixes itself."
    )
    output_config: OutputConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tools(cls, data):
        return hosted_tools_refused(
            data, ("custom",), "client tools (name, description, input_schema)"
        )

    @model_validator(mode="after")
    def _text_only(self):
        refusal = media_block(self.messages)
        if refusal:
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _tool_choice(self):
        c = self.tool_choice
        check_tool_choice(
            c,
            [t.name for t in self.tools or []],
            getattr(c, "name", None),
            c is not None and c.type in ("any", "tool"),
            "output_config.format" if self.output_config and self.output_config.format else None,
        )
        return self

    def system_text(self) -> str:
        """The system prompt the model reads: Claude Code's billing line left out (docs/api.md)."""
        if isinstance(self.system, str):
            return drop_billing_line(self.system)
        return "".join(drop_billing_line(b.text) for b in self.system or [])

    def chat(self, **more) -> dict:
        """The internal chat request's fields."""
        fields = {
            "model": self.model,
            "messages": chat_messages(self.system_text(), self.messages),
        } | more
        if self.tools:
            fields["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    },
                }
                for t in self.tools
            ]
        c = self.tool_choice
        if c is not None:
            fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(
                c.type
            ) or {"type": "function", "function": {"name": c.name}}
            if getattr(c, "disable_parallel_tool_use", None):
                fields["parallel_tool_calls"] = False
        fmt = self.output_config and self.output_config.format
        if fmt:
            fields["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output_config", "schema": fmt.schema_},
            }
        return fields


class MessagesRequest(CountTokensRequest):
    unsupported: ClassVar[dict[str, str]] = {
        "container": "it runs no code execution",
        "mcp_servers": "it connects to no MCP servers; send their tools as tools",
        "context_management": "it does not edit the conversation; send it as it should be read",
    }
    # Clearing thinking blocks asks nothing of a model that writes none (Claude Code
    # sends it by default).
    harmless: ClassVar[dict[str, object]] = {
        "context_management": lambda v: (
            isinstance(v, dict)
            and set(v) <= {"edits"}
            and (v.get("edits") is None or isinstance(v["edits"], list))
            and all(
                isinstance(e, dict) and str(e.get("type", "")).startswith("clear_thinking_")
                for e in v.get("edits") or []
            )
        )
    }
    # checked where the internal request is built (dialects.chat_request), by its bounds
    max_tokens: int = Field(json_schema_extra=bounds_of("max_tokens"))
    stop_sequences: list[str] | None = Field(None, json_schema_extra=bounds_of("stop"))
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)  # Anthropic's own range, inside ours
    top_p: float = Field(1.0, json_schema_extra=bounds_of("top_p"))
    top_k: int = Field(0, description="0: off.", json_schema_extra=bounds_of("top_k"))
    metadata: Metadata | None = Field(None, description="Accepted and ignored.")
    service_tier: str | None = Field(None, description="Accepted and ignored.")
    context_management: Annotated[
        dict | None,
        WithJsonSchema(
            {
                "anyOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "edits": {
                                "anyOf": [
                                    {"type": "null"},
                                    {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["type"],
                                            "properties": {
                                                "type": {
                                                    "type": "string",
                                                    "pattern": "^clear_thinking_",
                                                }
                                            },
                                        },
                                    },
                                ]
                            }
                        },
                    },
                ]
            }
        ),
    ] = Field(
        None,
        description="Accepted where it only clears thinking blocks, which this model never writes.",
    )
