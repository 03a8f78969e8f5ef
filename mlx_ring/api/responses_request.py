"""The Responses API's typed request (`POST /v1/responses`): its tool choice, text format and
accepted fields, checked, and its fields as the internal chat request's."""

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from mlx_ring.api import custom_tools
from mlx_ring.api.custom_tools import CustomTool, ToolChoiceCustom, ToolSearchTool
from mlx_ring.api.dialects import check_tool_choice
from mlx_ring.api.responses_items import (
    HOSTED_NOT_RUN,
    FunctionTool,
    Item,
    NamespaceTool,
    Tool,
    flat,
    input_messages,
    media_part,
)
from mlx_ring.api.schema import NAME, _Strict, bounds_of, hosted_tools_refused


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(_Strict):
    type: Literal["text", "json_object"]


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    name: str = Field(pattern=NAME)
    schema_: dict = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class Reasoning(_Strict):
    """Accepted and ignored: this server's models answer without a separate reasoning phase."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    context: Literal["auto", "current_turn", "all_turns"] | None = None


class TextConfig(_Strict):
    format: Annotated[TextFormat | JsonSchemaFormat, Field(discriminator="type")] | None = None
    verbosity: str | None = Field(None, description="Accepted and ignored.")


class ResponsesRequest(_Strict):
    unsupported: ClassVar[dict[str, str]] = {
        "background": "a response is made while its request is open",
        "conversation": "send previous_response_id or the whole input",
        "prompt": "stored prompts are not kept here; send instructions and input",
        "top_logprobs": "logprobs are not returned here; use /v1/chat/completions",
    }
    model: str | None = None
    input: Annotated[str, Field(min_length=1)] | Annotated[list[Item], Field(min_length=1)]
    instructions: str | None = None
    # checked where the internal request is built (dialects.chat_request), by its bounds
    max_output_tokens: int | None = Field(None, json_schema_extra=bounds_of("max_tokens"))
    temperature: float = Field(1.0, json_schema_extra=bounds_of("temperature"))
    top_p: float = Field(1.0, json_schema_extra=bounds_of("top_p"))
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | ToolChoiceCustom | None = (
        None
    )
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = Field(True, description="false: not kept for previous_response_id.")
    # Accepted and ignored: they do not change the answer.
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    client_metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None

    @model_validator(mode="before")
    @classmethod
    def _function_tools(cls, data):
        data = custom_tools.loaded_tools(custom_tools.hosted_search_refused(data))
        return hosted_tools_refused(
            data,
            ("function", "namespace", "custom", "tool_search", *HOSTED_NOT_RUN),
            "function or custom tools",
        )

    @model_validator(mode="after")
    def _text_only(self):
        refusal = media_part(self.input)
        if refusal:
            raise ValueError(refusal)
        custom_tools.check_forced(self.tools, self.tool_choice)
        return self

    @model_validator(mode="after")
    def _tools(self):
        names = [flat(ns, t.name) for ns, t in self.functions()]
        long = next((n for n in names if len(n) > 64), None)
        if long:
            raise ValueError(
                (
                    f"tools: a namespace and its function's name join as {long!r}, over 64 "
                    "characters; shorten them"
                )
            )
        named = (
            self.tool_choice.name
            if isinstance(self.tool_choice, (NamedFunction, ToolChoiceCustom))
            else None
        )
        fmt = self.text.format if self.text else None
        check_tool_choice(
            self.tool_choice,
            names,
            named,
            self.tool_choice == "required" or named is not None,
            "text.format" if fmt is not None and fmt.type != "text" else None,
        )
        return self

    def functions(self) -> list[tuple[str | None, FunctionTool | CustomTool | ToolSearchTool]]:
        """(namespace or None, tool) of every function the model is offered (custom and
        tool_search tools as functions)."""
        return [
            (None, t)
            for t in self.tools or []
            if isinstance(t, (FunctionTool, CustomTool, ToolSearchTool))
        ] + [
            (ns.name, t)
            for ns in self.tools or []
            if isinstance(ns, NamespaceTool)
            for t in ns.tools
        ]

    def chat(self, history: list[dict]) -> dict:
        """The internal chat request's fields, after `history` (the conversation so far)."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += history + input_messages(self.input)
        functions, choice = self.functions(), self.tool_choice
        named = choice.name if isinstance(choice, (NamedFunction, ToolChoiceCustom)) else None
        fields = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if functions:
            fields["tools"] = [
                {
                    "type": "function",
                    "function": t.function(choice == "required" or named == t.name)
                    if isinstance(t, (CustomTool, ToolSearchTool))
                    else t.model_dump(exclude={"type"}, exclude_none=True)
                    | {"name": flat(ns, t.name)},
                }
                for ns, t in functions
            ]
        if named is not None:
            fields["tool_choice"] = {"type": "function", "function": {"name": named}}
        elif self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text else None
        if isinstance(fmt, JsonSchemaFormat):
            spec = {"name": fmt.name, "schema": fmt.schema_} | (
                {"strict": fmt.strict} if fmt.strict is not None else {}
            )
            fields["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif fmt is not None:
            fields["response_format"] = {"type": fmt.type}
        return fields
