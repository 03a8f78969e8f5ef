"""Ollama's request bodies (`/api/chat`, `/api/generate`, `/api/show`) and their mapping onto the
one internal request: options to the same sampling fields, messages to chat messages."""

import json
import re
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from mlx_ring.api.openai_request import Tool
from mlx_ring.api.schema import _Strict, bounds_of, only_with

# Ollama option -> the internal request's field; other options (num_ctx, num_gpu,
# mirostat...) are ignored.
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# The internal request's field -> the client's, for the 400 of a bad value (dialects.chat_request).
NAMES = {ours: f"options.{theirs}" for theirs, ours in OPTIONS.items()}
NAMES["max_tokens"] = "options.num_predict"


def _bounded(option: str):
    """An option that the internal request's field checks when it is built, by its bounds."""
    return Field(None, json_schema_extra=bounds_of(OPTIONS[option]))


class Options(_Strict):
    # Ollama's load-time and other options: accepted, ignored
    model_config = ConfigDict(extra="allow")
    temperature: float | None = _bounded("temperature")
    top_p: float | None = _bounded("top_p")
    top_k: int | None = _bounded("top_k")
    min_p: float | None = _bounded("min_p")
    seed: int | None = _bounded("seed")
    stop: list[str] | None = _bounded("stop")
    repeat_penalty: float | None = _bounded("repeat_penalty")
    presence_penalty: float | None = _bounded("presence_penalty")
    frequency_penalty: float | None = _bounded("frequency_penalty")
    num_predict: int | None = Field(
        None, description="Most tokens to generate; -1 or -2: as many as fit."
    )


class Call(_Strict):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: dict


class ToolCallOut(_Strict):
    model_config = ConfigDict(extra="allow")
    function: Call


# Named in /openapi.json by its module (mlx_ring__api__ollama__Message, as Anthropic has a Message
# too): the request models stay here so that the document does not change.
class Message(_Strict):
    model_config = ConfigDict(
        json_schema_extra=only_with(
            "tool_calls", "role", {"type": "array", "minItems": 1}, {"const": "assistant"}
        )
    )
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Annotated[
        list[str] | None,
        WithJsonSchema({"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}),
    ] = Field(None, description="Not supported: this model reads text only.")
    tool_calls: list[ToolCallOut] | None = None
    tool_name: str | None = None
    thinking: str | None = Field(
        None, description="Accepted and dropped: this server does not think apart."
    )

    @model_validator(mode="after")
    def _check(self):
        if self.images:
            raise ValueError("images are not supported by this text model; send text")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        return self


class _Generating(_Strict):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Literal["", "json"] | dict | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = Field(
        None, description="Accepted and ignored: the ring keeps its model."
    )
    think: Annotated[
        bool | Literal["low", "medium", "high"] | None, WithJsonSchema({"enum": [False, None]})
    ] = Field(None, description="Not supported: false or left out.")

    @model_validator(mode="after")
    def _no_thinking(self):
        if self.think:
            raise ValueError("think: not supported by this server; leave it unset or false")
        return self

    def unloads(self) -> bool:
        """keep_alive 0 (as a number or a Go duration such as "0s"): with nothing
        to answer, Ollama unloads."""
        k = self.keep_alive
        return (
            k == 0
            if not isinstance(k, str)
            else bool(re.fullmatch(r"0+(\.0*)?((ns|us|µs|ms|s|m|h)(0+(\.0*)?)?)*", k.strip()))
        )

    def fields(self) -> dict:
        """The internal request's sampling fields."""
        opts = self.options or Options()
        fields = {
            ours: getattr(opts, theirs)
            for theirs, ours in OPTIONS.items()
            if getattr(opts, theirs) is not None
        }
        if opts.num_predict is not None and opts.num_predict > 0:
            fields["max_tokens"] = opts.num_predict
        model = self.model.removesuffix(":latest")
        return fields | {"model": model, "stream": self.stream}

    def response_format(self) -> dict | None:
        if self.format == "json":
            return {"type": "json_object"}
        if isinstance(self.format, dict):
            return {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}
        return None


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = Field(None, max_length=128)


class GenerateRequest(_Generating):
    model_config = ConfigDict(
        json_schema_extra=only_with("raw", "format", {"const": True}, {"enum": ["", None]})
    )
    unsupported: ClassVar[dict[str, str]] = {"images": "it is a text model; send text"}
    harmless: ClassVar[dict[str, object]] = {"images": []}
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: Literal[""] | None = Field(
        None, description="Not supported: fill-in-the-middle needs a model that has it."
    )
    template: Literal[""] | None = Field(
        None, description="Not supported: the model's own chat template is used."
    )
    context: list[int] | None = Field(
        None,
        max_length=0,
        description="Not supported (deprecated by Ollama): send the conversation to /api/chat.",
    )
    images: list[str] | None = Field(
        None, max_length=0, description="Not supported: this model reads text only."
    )

    @model_validator(mode="after")
    def _raw(self):
        if self.raw and self.response_format():
            raise ValueError(
                "format: not supported with raw; use the chat template (raw false) or /api/chat"
            )
        return self


class ShowRequest(_Strict):
    """As the Ollama client sends it (api/types.go: every field, empty ones too)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [f], "properties": {f: {"minLength": 1}}} for f in ("model", "name")
            ]
        }
    )

    model: str = ""
    name: str = Field("", description="Deprecated by Ollama: the model, when `model` is empty.")
    verbose: bool | None = None
    system: str | None = Field(
        None, description="Accepted and ignored: the answer shows no Modelfile."
    )
    template: str | None = Field(None, description="Accepted and ignored (deprecated by Ollama).")
    options: dict | None = Field(
        None, description="Accepted and ignored: the answer shows no Modelfile."
    )

    @model_validator(mode="after")
    def _named(self):
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self


def chat_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages as chat messages: its tool calls and results carry no ids, so each
    call gets one and each tool result takes the id of the first open call of its name
    (else the first open)."""
    out, open_calls = [], []
    for n, m in enumerate(messages):
        msg = {"role": m.role, "content": m.content}
        if m.tool_calls:
            calls = [
                {
                    "id": f"call_{n}_{k}",
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": json.dumps(c.function.arguments),
                    },
                }
                for k, c in enumerate(m.tool_calls)
            ]
            msg["tool_calls"], open_calls = calls, list(calls)
        if m.role == "tool":
            match = next(
                (c for c in open_calls if c["function"]["name"] == m.tool_name),
                open_calls[0] if open_calls else None,
            )
            if match:
                open_calls.remove(match)
            msg["tool_call_id"] = match["id"] if match else f"call_{n}"
        out.append(msg)
    return out
