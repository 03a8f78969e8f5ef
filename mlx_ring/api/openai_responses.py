"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) as a thin adapter: its
typed request (input text or items, instructions, function tools and their outputs, text.format)
becomes the one internal chat request; the engine's events become a response object or its stream
of named events. `previous_response_id` continues a conversation kept on rank 0, in a bounded
store: the prompt cache then finds the shared prefix, so only the new turn is prefilled."""

import time
import uuid
from typing import Annotated, ClassVar, Literal

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from mlx_ring.api import custom_tools
from mlx_ring.api.bodies import Bodies
from mlx_ring.api.custom_tools import (
    ArgumentStream,
    CustomTool,
    ToolChoiceCustom,
    ToolSearchOutputItem,
    ToolSearchTool,
)
from mlx_ring.api.dialects import (
    chat_request,
    check_tool_choice,
    collect,
    dialect_router,
    named_sse,
)
from mlx_ring.api.errors import ERROR_SCHEMA, ApiError
from mlx_ring.api.front import Front
from mlx_ring.api.openapi import body_of
from mlx_ring.api.responses_kept import Kept
from mlx_ring.api.schema import NAME, Refused, _Strict, bounds_of, hosted_tools_refused


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


def flat(namespace: str | None, name: str) -> str:
    """A namespaced function's name as the model sees it."""
    return f"{namespace}__{name}" if namespace else name


def namespaced(body: ResponsesRequest) -> dict[str, dict]:
    """The model's names of namespaced functions -> the `name` and `namespace` their calls carry."""
    return {
        flat(ns.name, t.name): {"name": t.name, "namespace": ns.name}
        for ns in body.tools or []
        if isinstance(ns, NamespaceTool)
        for t in ns.tools
    }


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


def message_item(mid: str, text: str, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": mid,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else [],
    }


class ResponseDraft:
    """One response being made: its object, filled in as the events come."""

    def __init__(self, body: ResponsesRequest, model: str, history: list[dict]):
        self.body, self.conversation, self.names = (
            body,
            history + input_messages(body.input),
            namespaced(body),
        )
        self.clients = custom_tools.client_tools(body.tools)
        self.object = {
            "id": f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": model,
            "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": body.tool_choice.model_dump()
            if isinstance(body.tool_choice, BaseModel)
            else body.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "text": body.text.model_dump(by_alias=True, exclude_none=True)
            if body.text
            else {"format": {"type": "text"}},
            "store": body.store,
            "metadata": body.metadata or {},
            "usage": None,
        }

    def item(self, call: dict, status: str = "completed") -> dict:
        """A parsed call as its output item: a function_call, or a custom or tool_search tool's
        own item."""
        f = call["function"]
        if f["name"] in self.clients:
            return custom_tools.output_item(call, self.clients[f["name"]], status)
        return {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:24]}",
            "call_id": call["id"],
            "name": f["name"],
            "arguments": f["arguments"] if status == "completed" else "",
            "status": status,
        } | self.names.get(f["name"], {})

    def finish(self, text: str, calls: list[dict], done, kept: Kept, output: list[dict]) -> dict:
        length = done.finish_reason == "length"
        self.object |= {
            "status": "incomplete" if length else "completed",
            "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "usage": {
                "input_tokens": done.prompt_tokens,
                "input_tokens_details": {"cached_tokens": done.cached_tokens},
                "output_tokens": done.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": done.prompt_tokens + done.completion_tokens,
            },
        }
        if self.body.store:
            said = {"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {})
            kept.put(self.object["id"], self.conversation + [said], self.object)
        return self.object


def responses_routes(front: Front, bodies: Bodies, kept: Kept) -> APIRouter:
    router = dialect_router(lambda status, openai: openai, ERROR_SCHEMA)

    @router.post("/v1/responses", openapi_extra=body_of(ResponsesRequest))
    async def create(http: HttpRequest):
        body = await bodies.read(ResponsesRequest, await http.body())
        history = kept.get(body.previous_response_id)[0] if body.previous_response_id else []
        chat = chat_request(body.chat(history), names={"max_tokens": "max_output_tokens"})
        custom_tools.constrain_calls(chat, body.tools)
        answer = ResponseDraft(body, front.served.id, history)
        _, events = await front.events(chat, http, stream_calls=body.stream)
        if body.stream:
            return StreamingResponse(stream(answer, events, kept), media_type="text/event-stream")
        text, calls, done = await collect(events)
        output = (
            [message_item(f"msg_{uuid.uuid4().hex[:24]}", text.strip() if calls else text)]
            if text.strip() or not calls
            else []
        )
        return answer.finish(text, calls, done, kept, output + [answer.item(c) for c in calls])

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str):
        try:
            return kept.get(response_id)[1]
        except ApiError as e:
            raise ApiError(
                404,
                e.message.replace("previous_response_id: ", ""),
                param="response_id",
                code="response_not_found",
            ) from None

    return router


async def stream(answer: ResponseDraft, events, kept: Kept):
    """response.created, response.in_progress, each output item's added, deltas and done events,
    then response.completed (or .incomplete, or .failed)."""
    seq = iter(range(1 << 62))

    def ev(kind: str, **fields) -> str:
        return named_sse({"type": kind, "sequence_number": next(seq)} | fields)

    yield ev("response.created", response=answer.object)
    yield ev("response.in_progress", response=answer.object)
    output, text, said, blank, calls, mid, open_call, args = [], None, [], "", [], "", None, None
    async for kind, value in events:
        if kind == "text":
            if text is None and not (blank + value).strip():
                blank += value  # whitespace before a tool call opens no message
                continue
            if text is None:
                text, value, blank, mid = [], blank + value, "", f"msg_{uuid.uuid4().hex[:24]}"
                yield ev(
                    "response.output_item.added",
                    output_index=len(output),
                    item=message_item(mid, "", "in_progress"),
                )
                yield ev(
                    "response.content_part.added",
                    item_id=mid,
                    output_index=len(output),
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            text.append(value)
            said.append(value)
            yield ev(
                "response.output_text.delta",
                item_id=mid,
                output_index=len(output),
                content_index=0,
                delta=value,
                logprobs=[],
            )
            continue
        if text is not None:
            item, at = message_item(mid, "".join(text)), len(output)
            yield ev(
                "response.output_text.done",
                item_id=mid,
                output_index=at,
                content_index=0,
                text=item["content"][0]["text"],
                logprobs=[],
            )
            yield ev(
                "response.content_part.done",
                item_id=mid,
                output_index=at,
                content_index=0,
                part=item["content"][0],
            )
            yield ev("response.output_item.done", output_index=at, item=item)
            output.append(item)
            text = None
        if kind == "begin":  # a call's arguments as they are generated
            open_call, at = answer.item(value, "in_progress"), len(output)
            args = ArgumentStream(open_call["type"])
            yield ev("response.output_item.added", output_index=at, item=open_call)
        elif kind == "args":
            if delta := args.feed(value):
                yield ev(
                    f"{args.event}.delta",
                    item_id=open_call["id"],
                    output_index=len(output),
                    delta=delta,
                )
        elif kind in ("call", "end"):
            calls.append(value)
            item, at = answer.item(value), len(output)
            # its events name the whole arguments (a function's) or input (a custom tool's)
            args = ArgumentStream(item["type"])
            if kind == "end":
                item, open_call = item | {"id": open_call["id"]}, None
            else:  # a call parsed whole
                yield ev(
                    "response.output_item.added",
                    output_index=at,
                    item=answer.item(value, "in_progress") | {"id": item["id"]},
                )
                if args.event:
                    yield ev(
                        f"{args.event}.delta",
                        item_id=item["id"],
                        output_index=at,
                        delta=item[args.field],
                    )
            if args.event:
                yield ev(
                    f"{args.event}.done",
                    item_id=item["id"],
                    output_index=at,
                    **{args.field: item[args.field]},
                )
            yield ev("response.output_item.done", output_index=at, item=item)
            output.append(item)
        elif kind == "failed":
            answer.object |= {
                "status": "failed",
                "output": output,
                "error": {"code": "server_error", "message": value.message},
            }
            yield ev("response.failed", response=answer.object)
            return
        else:
            obj = answer.finish("".join(said), calls, value, kept, output)
            yield ev(
                "response.incomplete" if obj["status"] == "incomplete" else "response.completed",
                response=obj,
            )
