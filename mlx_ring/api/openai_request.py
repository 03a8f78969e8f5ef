"""OpenAI's chat completion and completion requests, with chat messages, their parts and tools:
also the one internal request every dialect is turned into (dialects.chat_request)."""

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, WithJsonSchema, model_validator

from mlx_ring.api.schema import (
    _STREAM_OPTIONS_RULE,
    NAME,
    ResponseFormat,
    _Sampling,
    _Strict,
    only_with,
)

MAX_TOP_LOGPROBS = 20


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class MediaPart(BaseModel):
    """An image, audio or file part: recognised, so that the error can say what is not supported."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_audio", "file"]


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(
        description="The arguments as a JSON object, in a string (as OpenAI sends them)."
    )


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


# Documented as text only: other parts are recognised only to be refused with a clear message.
_TEXT_PART = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_TEXT_CONTENT = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]
}


class ChatMessage(_Strict):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"required": ["role"], "properties": {"role": {"const": "tool"}}},
                    "then": {
                        "required": ["tool_call_id"],
                        "properties": {"tool_call_id": {"type": "string"}},
                    },
                },
                {
                    "if": {
                        "required": ["tool_calls"],
                        "properties": {"tool_calls": {"type": "array"}},
                    },
                    "then": {"properties": {"role": {"const": "assistant"}}},
                },
            ]
        }
    )
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        str | Annotated[list[TextPart | MediaPart], Field(fail_fast=True)] | None,
        WithJsonSchema(_TEXT_CONTENT),
    ] = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(fail_fast=True)] | None = Field(
        None, description="assistant: the calls it made"
    )
    tool_call_id: str | None = Field(None, description="tool: the call this message answers")

    @model_validator(mode="after")
    def _check(self):
        media = (
            [p.type for p in self.content if isinstance(p, MediaPart)]
            if isinstance(self.content, list)
            else []
        )
        if media:
            raise ValueError(
                f"{media[0]} parts are not supported: this model reads text only; send text parts"
            )
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(_Strict):
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict | None = Field(None, description="A JSON Schema of the arguments object.")
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str = Field(pattern=NAME)


class NamedTool(_Strict):
    type: Literal["function"]
    function: FunctionName


_PROMPT = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
    ]
}


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _STREAM_OPTIONS_RULE,
                only_with(
                    "top_logprobs", "logprobs", {"type": "integer", "minimum": 1}, {"const": True}
                ),
            ]
        }
    )
    unsupported: ClassVar[dict[str, str]] = {
        "audio": "it answers in text only",
        "modalities": 'it answers in text only; send ["text"] or leave it out',
        "functions": "send them as tools",
        "function_call": "send tool_choice",
        "prediction": "predicted outputs are not used",
        "web_search_options": "it has no web search",
    }
    harmless: ClassVar[dict[str, object]] = {"modalities": ["text"]}
    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[Tool], Field(fail_fast=True)] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = Field(
        None, description="false: at most one tool call per answer."
    )
    response_format: ResponseFormat | None = None
    modalities: Annotated[
        list[Literal["text"]] | None,
        WithJsonSchema({"anyOf": [{"const": ["text"]}, {"type": "null"}]}),
    ] = Field(None, description='["text"] or left out: answers are text.')
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None,
        description=(
            "Accepted and ignored: this server's models answer without a separate reasoning phase."
        ),
    )
    # set by a dialect whose tool calls are constrained in free answers too: (the template's call
    # markers) -> grammar
    _call_grammar: object = PrivateAttr(None)

    def constrain_calls(self, grammar) -> None:
        """Decode this answer under `grammar(start, end)` (text, and tool
        calls between those markers)."""
        self._call_grammar = grammar

    @model_validator(mode="after")
    def _check_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice: only allowed when tools are given")
        if isinstance(self.tool_choice, NamedTool) and self.tool_choice.function.name not in [
            t.function.name for t in self.tools
        ]:
            raise ValueError(
                (
                    f"tool_choice: names {self.tool_choice.function.name!r}, which is "
                    "not one of the tools"
                )
            )
        if (
            self.forced_tools()
            and self.response_format is not None
            and self.response_format.type != "text"
        ):
            raise ValueError(
                (
                    "response_format: a JSON answer and a required tool call exclude "
                    "each other; drop one"
                )
            )
        return self

    def forced_tools(self) -> list[Tool]:
        """The tools one of which the answer must call (tool_choice required or named), else []."""
        if self.tool_choice == "required":
            return list(self.tools)
        if isinstance(self.tool_choice, NamedTool):
            return [t for t in self.tools if t.function.name == self.tool_choice.function.name]
        return []

    def offered_tools(self) -> list[Tool]:
        """The tools the chat template shows the model (none with tool_choice none)."""
        return [] if self.tool_choice == "none" else list(self.tools or [])

    def max_tokens_asked(self) -> int | None:
        """The completion limit the client asked for (max_completion_tokens,
        else max_tokens), if any."""
        return self.max_completion_tokens or self.max_tokens

    def logprob_count(self) -> int | None:
        """None: no logprobs; else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    default_tokens: ClassVar[int | None] = 16
    prompt: Annotated[
        Annotated[str, Field(min_length=1)]
        | Annotated[list[int], Field(min_length=1, fail_fast=True)],
        WithJsonSchema(_PROMPT),
    ]
    logprobs: int | None = Field(None, ge=0, le=5)
    max_tokens: int | None = Field(None, ge=1, description="Default 16, as OpenAI's.")
    echo: bool = Field(
        False, json_schema_extra={"const": False}, description="Not supported: must be false."
    )
    suffix: None = None

    @model_validator(mode="after")
    def _check_echo(self):
        if self.echo:
            raise ValueError("echo: not supported; leave it false")
        if isinstance(self.prompt, list) and min(self.prompt) < 0:
            raise ValueError(
                f"prompt: token id {min(self.prompt)} is negative; token ids are 0 or more"
            )
        return self

    def max_tokens_asked(self) -> int | None:
        return self.max_tokens

    def logprob_count(self) -> int | None:
        return self.logprobs
