"""One API request's answer: its `n` choices queued for the engine (as one, so they share a prefill),
their events merged, and turned into an OpenAI response, whole or streamed. No MLX here."""

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from fastapi import Request as HttpRequest
from fastapi.responses import StreamingResponse

from mlx_ring.api.errors import ApiError, error_body
from mlx_ring.api.keys import RateLimited, reserve_tokens, settle
from mlx_ring.api.metrics import Clock, RingMetrics
from mlx_ring.api.responses import chat_logprobs, completion_logprobs, sse, usage
from mlx_ring.api.served import ServedModel, max_tokens_for
from mlx_ring.api.toolcalls import ToolCallText
from mlx_ring.serving.port import Delta, Done, EnginePort, Failed, QueueFull, Request, Unavailable


@dataclass
class Choice:
    """One choice's answer so far: content, tool calls and the tokens behind them."""

    index: int
    tools: ToolCallText | None  # None: no tools offered, all text is content
    content: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    tokens: list = field(default_factory=list)
    done: Done | None = None

    def add(self, text: str, final: bool = False) -> list[tuple]:
        """The parts (`ToolCallText`'s) that `text` releases; `final`: the choice has ended."""
        parts = self.tools.feed(text) if self.tools else [("text", None, text)] if text else []
        if final and self.tools:
            parts += self.tools.finish()
        for kind, _, value in parts:
            if kind == "text":
                self.content.append(value)
            elif kind in ("call", "end"):
                self.calls.append(value)
        return parts

    def finish_reason(self) -> str:
        return "tool_calls" if self.calls and self.done.finish_reason == "stop" else self.done.finish_reason


class Answers:
    def __init__(self, engine: EnginePort, served: ServedModel, metrics: RingMetrics):
        self.engine, self.served, self.metrics = engine, served, metrics

    def token_text(self, tid: int) -> str:
        return self.served.tokenizer.decode([tid])

    def _submit(self, body, prompt: list[int], grammar: str | None) -> tuple[list[Request], asyncio.Queue]:
        """The request's choices, queued together; their events arrive on one asyncio queue as (index, event)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        max_tokens, top, reqs = max_tokens_for(self.served, prompt, body), body.logprob_count() or 0, []
        for i in range(body.n):
            reqs.append(Request(prompt, max_tokens, body.sampling(top, i, grammar), stop=body.stops(),
                                emit=lambda ev, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, ev)),
                                after=reqs[0] if reqs else None))  # the others start from the first's cached prompt
        try:
            self.engine.submit(*reqs)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy ({e}); retry shortly", "server_overloaded", headers={"Retry-After": "1"}) from None
        except Unavailable as e:
            raise ApiError(503, f"the server is not taking requests: {e}", "service_unavailable", headers={"Retry-After": "5"}) from None
        return reqs, events

    def _reserve(self, http: HttpRequest, body, prompt: list[int]) -> list | None:
        """The request's tokens (prompt + n x max_tokens) against its key's tokens per minute."""
        key = getattr(http.state, "key", None)
        if key is None:
            return None
        try:
            return reserve_tokens(key, len(prompt) + body.n * max_tokens_for(self.served, prompt, body))
        except RateLimited as e:
            raise ApiError(429, str(e), e.kind, code="rate_limit_exceeded", headers={"Retry-After": str(e.retry_after)}) from None

    async def _run(self, reqs: list[Request], events: asyncio.Queue, http: HttpRequest, reservation: list | None):
        """Yield (index, event) for every choice until all are done or one fails; on exit every
        choice is marked cancelled (a no-op once finished), which frees it on every rank."""
        async def watch_disconnect():
            # The body is already read, so the next ASGI message is the client hanging up.
            while (await http.receive())["type"] != "http.disconnect":
                pass
            self.engine.cancel(*reqs)

        watcher = asyncio.create_task(watch_disconnect())
        clocks, running, used, failed = [Clock(self.metrics) for _ in reqs], set(range(len(reqs))), len(reqs[0].prompt), True
        try:
            while running:
                i, ev = await events.get()
                if isinstance(ev, Delta):
                    clocks[i].tokens(len(ev.tokens))
                elif isinstance(ev, Done):
                    running.discard(i)
                    self.metrics.completion_tokens.inc(ev.completion_tokens)
                    used += ev.completion_tokens
                yield i, ev
                if isinstance(ev, Failed):
                    return
            failed = False
            self.metrics.prompt_tokens.inc(len(reqs[0].prompt))
        finally:
            if reservation:  # failed or cancelled: what the choices used is unknown, the prompt is counted
                settle(reservation, len(reqs[0].prompt) if failed else used)
            watcher.cancel()
            self.engine.cancel(*reqs)

    def start(self, body, prompt: list[int], http: HttpRequest, grammar: str | None = None):
        """Queue a checked request for an answer in another dialect's shape: the flow of (index, event)
        that `respond` reads, ending with Done or Failed. A 429 or 503 ApiError before anything is queued."""
        reservation = self._reserve(http, body, prompt)
        try:
            reqs, events = self._submit(body, prompt, grammar)
        except ApiError:
            if reservation:
                settle(reservation, 0)
            raise
        return self._run(reqs, events, http, reservation)

    async def respond(self, body, prompt: list[int], http: HttpRequest, chat: bool, grammar: str | None = None,
                      tools: dict | None = None):
        """The answer to a checked request. `tools`: keyword arguments of `ToolCallText` when the
        chat offered tools (their calls are parsed out of the text), else None."""
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        reservation = self._reserve(http, body, prompt)  # before any byte is sent: a 429 is a plain answer
        try:
            reqs, events = self._submit(body, prompt, grammar)  # before any byte is sent: a full queue is a plain 503
        except ApiError:
            if reservation:
                settle(reservation, 0)  # refused: it used nothing
            raise
        choices = [Choice(i, ToolCallText(**tools, stream=body.stream) if tools else None) for i in range(body.n)]
        head = {"id": rid, "created": int(time.time()), "model": self.served.id}
        flow = self._run(reqs, events, http, reservation)
        if body.stream:
            return StreamingResponse(self._stream(flow, choices, head, chat, body), media_type="text/event-stream")
        async for i, ev in flow:
            c = choices[i]
            if isinstance(ev, Failed):  # a 503 (draining, the ring down) says when to retry, as one before queueing does
                raise ApiError(ev.status, ev.message, ev.type, headers={"Retry-After": "5"} if ev.status == 503 else None)
            if isinstance(ev, Delta):
                c.tokens += ev.tokens
                c.add(ev.text)
            else:
                c.done = ev
                c.add("", final=True)
        top = body.logprob_count()
        out = []
        for c in choices:
            text = "".join(c.content)
            if chat:
                message = {"role": "assistant", "content": (text.strip() or None) if c.calls else text}
                if c.calls:
                    message["tool_calls"] = c.calls
                out.append({"index": c.index, "message": message, "logprobs": chat_logprobs(c.tokens, top, self.token_text),
                            "finish_reason": c.finish_reason()})
            else:
                out.append({"index": c.index, "text": text, "logprobs": completion_logprobs(c.tokens, top, self.token_text),
                            "finish_reason": c.finish_reason()})
        return head | {"object": "chat.completion" if chat else "text_completion", "choices": out, "usage": usage([c.done for c in choices])}

    async def _stream(self, flow, choices: list[Choice], head: dict, chat: bool, body):
        obj = "chat.completion.chunk" if chat else "text_completion"
        top = body.logprob_count()

        def chunk(index, delta_or_text, finish=None, logprobs=None):
            choice = {"index": index, "logprobs": logprobs, "finish_reason": finish}
            choice["delta" if chat else "text"] = delta_or_text
            return sse(head | {"object": obj, "choices": [choice]})

        if chat:
            for c in choices:
                yield chunk(c.index, {"role": "assistant", "content": ""})
        async for i, ev in flow:
            c = choices[i]
            if isinstance(ev, Failed):
                yield sse(error_body(ev.message, ev.type))
                break
            if isinstance(ev, Done):
                c.done = ev
            parts = c.add(ev.text if isinstance(ev, Delta) else "", final=isinstance(ev, Done))
            content = "".join(value for kind, _, value in parts if kind == "text")
            tokens = ev.tokens if isinstance(ev, Delta) else []
            lp = (chat_logprobs if chat else completion_logprobs)(tokens, top, self.token_text) if tokens else None
            if content or lp:
                yield chunk(i, {"content": content} if chat else content, logprobs=lp)
            for kind, n, value in parts:  # a call's id and name, then its arguments as they come; or the call whole
                if kind in ("begin", "call"):
                    yield chunk(i, {"tool_calls": [{"index": n} | value]})
                elif kind == "args":
                    yield chunk(i, {"tool_calls": [{"index": n, "function": {"arguments": value}}]})
            if c.done is not None:
                yield chunk(i, {} if chat else "", finish=c.finish_reason())
        else:
            if body.stream_options and body.stream_options.include_usage:
                yield sse(head | {"object": obj, "choices": [], "usage": usage([c.done for c in choices])})
        yield "data: [DONE]\n\n"

