"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`) as a thin adapter:
its typed request (input text or items, instructions, function tools and their outputs,
text.format; responses_request.py) becomes the one internal chat request; the engine's events
become a response object or its stream of named events. `previous_response_id` continues a
conversation kept on rank 0, in a bounded store: the prompt cache then finds the shared prefix,
so only the new turn is prefilled."""

import time
import uuid

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from mlx_ring.api import custom_tools
from mlx_ring.api.bodies import Bodies
from mlx_ring.api.custom_tools import ArgumentStream
from mlx_ring.api.dialects import chat_request, collect, dialect_router, named_sse
from mlx_ring.api.errors import ERROR_SCHEMA, ApiError
from mlx_ring.api.front import Front
from mlx_ring.api.keepalive import SSE_COMMENT, beating
from mlx_ring.api.openapi import body_of
from mlx_ring.api.responses_items import NamespaceTool, flat, input_messages
from mlx_ring.api.responses_kept import Kept
from mlx_ring.api.responses_request import ResponsesRequest


def namespaced(body: ResponsesRequest) -> dict[str, dict]:
    """The model's names of namespaced functions -> the `name` and `namespace` their calls carry."""
    return {
        flat(ns.name, t.name): {"name": t.name, "namespace": ns.name}
        for ns in body.tools or []
        if isinstance(ns, NamespaceTool)
        for t in ns.tools
    }


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
        """A parsed call as its output item: a function_call, or a custom or
        tool_search tool's own item."""
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
            return StreamingResponse(
                stream(answer, events, kept, front.keepalive_s), media_type="text/event-stream"
            )
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


async def stream(answer: ResponseDraft, events, kept: Kept, keepalive_s: float):
    """response.created, response.in_progress, each output item's added, deltas and done events,
    then response.completed (or .incomplete, or .failed). Until the first token, a comment every
    `keepalive_s` seconds keeps the stream alive."""
    seq = iter(range(1 << 62))

    def ev(kind: str, **fields) -> str:
        return named_sse({"type": kind, "sequence_number": next(seq)} | fields)

    yield ev("response.created", response=answer.object)
    yield ev("response.in_progress", response=answer.object)
    output, text, said, blank, calls, mid, open_call, args = [], None, [], "", [], "", None, None
    async for event in beating(events, keepalive_s):
        if event is None:
            yield SSE_COMMENT
            continue
        kind, value = event
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
