"""OpenAI's chat completions, completions and models (`/v1/chat/completions`, `/v1/completions`,
`/v1/models`) as an adapter over the front: the body read (off the event loop when large,
bodies.py), checked, tokenized and queued by `Front`, its steps turned into OpenAI's response,
whole or streamed. No MLX here."""

import time
import uuid

from fastapi import APIRouter
from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from mlx_ring.api.bodies import Bodies
from mlx_ring.api.errors import ERROR_SCHEMA, ApiError, error_body
from mlx_ring.api.front import Front, Reply
from mlx_ring.api.keepalive import SSE_COMMENT, beating
from mlx_ring.api.openai_parts import chat_logprobs, completion_logprobs, sse, usage
from mlx_ring.api.openai_request import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.openapi import body_of
from mlx_ring.api.served import check_model
from mlx_ring.serving.port import Failed


def openai_routes(front: Front, bodies: Bodies) -> APIRouter:
    router = APIRouter()
    served = front.served

    @router.post("/v1/chat/completions", openapi_extra=body_of(ChatCompletionRequest))
    async def chat_completions(http: HttpRequest):
        body = await bodies.read(ChatCompletionRequest, await http.body())
        answer = front.open(body, await front.chat(body), http, stream_calls=body.stream)
        return await respond(front, body, answer, chat=True)

    @router.post("/v1/completions", openapi_extra=body_of(CompletionRequest))
    async def completions(http: HttpRequest):
        body = await bodies.read(CompletionRequest, await http.body())
        answer = front.open(body, await front.completion(body), http)
        return await respond(front, body, answer, chat=False)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "mlx-ring"}

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(name) for name in served.names()]}

    unknown = {
        404: {
            "description": "Unknown model",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
    }

    @router.get("/v1/models/{model_id:path}", responses=unknown)
    async def model(model_id: str):
        check_model(served, model_id)  # any name the model answers to, an alias's pattern included
        return model_card(served.id if model_id == "default" else model_id)

    return router


async def respond(front: Front, body, answer: Reply, chat: bool):
    """OpenAI's answer to a queued request: a chat completion or a text
    completion, whole or streamed."""
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    head = {"id": rid, "created": int(time.time()), "model": front.served.id}

    def token_text(tid: int) -> str:
        return front.served.tokenizer.decode([tid])

    if body.stream:
        return StreamingResponse(
            stream(answer, head, chat, body, token_text, front.keepalive_s),
            media_type="text/event-stream",
        )
    async for step in answer.steps:
        end = step.end
        # a 503 (draining, the ring down) says when to retry, as one before queueing does
        if isinstance(end, Failed):
            raise ApiError(
                end.status,
                end.message,
                end.type,
                headers={"Retry-After": "5"} if end.status == 503 else None,
            )
    top = body.logprob_count()
    out = []
    for c in answer.choices:
        text = "".join(c.content)
        if chat:
            message = {"role": "assistant", "content": (text.strip() or None) if c.calls else text}
            if c.calls:
                message["tool_calls"] = c.calls
            out.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": chat_logprobs(c.tokens, top, token_text),
                    "finish_reason": c.finish_reason(),
                }
            )
        else:
            out.append(
                {
                    "index": c.index,
                    "text": text,
                    "logprobs": completion_logprobs(c.tokens, top, token_text),
                    "finish_reason": c.finish_reason(),
                }
            )
    return head | {
        "object": "chat.completion" if chat else "text_completion",
        "choices": out,
        "usage": usage([c.done for c in answer.choices]),
    }


async def stream(answer: Reply, head: dict, chat: bool, body, token_text, keepalive_s: float):
    """OpenAI's server-sent events: chunks of each choice's content, logprobs and tool calls, its
    finish, the usage when asked for, then [DONE]; a failure mid-way is an error event. Until the
    first token, a comment every `keepalive_s` seconds keeps the stream alive."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    top = body.logprob_count()

    def chunk(index, delta_or_text, finish=None, logprobs=None):
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish}
        choice["delta" if chat else "text"] = delta_or_text
        return sse(head | {"object": obj, "choices": [choice]})

    if chat:
        for c in answer.choices:
            yield chunk(c.index, {"role": "assistant", "content": ""})
    async for step in beating(answer.steps, keepalive_s, lambda s: s.begun):
        if step is None:
            yield SSE_COMMENT
            continue
        i = step.choice.index
        if isinstance(step.end, Failed):
            yield sse(error_body(step.end.message, step.end.type))
            break
        content = "".join(value for kind, _, value in step.parts if kind == "text")
        lp = (
            (chat_logprobs if chat else completion_logprobs)(step.tokens, top, token_text)
            if step.tokens
            else None
        )
        if content or lp:
            yield chunk(i, {"content": content} if chat else content, logprobs=lp)
        # a call's id and name, then its arguments as they come; or the call whole
        for kind, n, value in step.parts:
            if kind in ("begin", "call"):
                yield chunk(i, {"tool_calls": [{"index": n} | value]})
            elif kind == "args":
                yield chunk(i, {"tool_calls": [{"index": n, "function": {"arguments": value}}]})
        if step.end is not None:
            yield chunk(i, {} if chat else "", finish=step.choice.finish_reason())
    else:
        if body.stream_options and body.stream_options.include_usage:
            yield sse(
                head
                | {"object": obj, "choices": [], "usage": usage([c.done for c in answer.choices])}
            )
    yield "data: [DONE]\n\n"
