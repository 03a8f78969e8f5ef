"""The one way into serving for every dialect: a request checked against the served model, tokenized
off the event loop, its tokens reserved against its key, its `n` choices submitted to the engine
together (so they share a prefill), and its answer as one flow of steps that each adapter
(openai_chat, openai_responses, anthropic, ollama) turns into its own response. No MLX here."""

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from fastapi import Request as HttpRequest

from mlx_ring.api.chat import tool_calls
from mlx_ring.api.errors import ApiError
from mlx_ring.api.keepalive import KEEPALIVE_S
from mlx_ring.api.keys import RateLimited, reserve_tokens, settle
from mlx_ring.api.metrics import Clock, RingMetrics
from mlx_ring.api.openai_request import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.produced import ProducedTurns, as_written
from mlx_ring.api.prompts import Prompts
from mlx_ring.api.served import ServedModel, check_model, check_sampling, max_tokens_for
from mlx_ring.api.toolcalls import ToolCallText
from mlx_ring.serving.port import (
    Delta,
    Done,
    EnginePort,
    Failed,
    QueueFull,
    Request,
    Started,
    Unavailable,
)


@dataclass
class Prompt:
    """A checked request's prompt: its token ids, the grammar its answer must match, and how tool
    calls are found in the answer's text (`ToolCallText`'s arguments; None: no tools offered)."""

    ids: list[int]
    grammar: str | None = None
    tools: dict | None = None
    # from a chat template: its answers are remembered as written (produced.py)
    templated: bool = False


@dataclass
class ChoiceState:
    """One choice's answer so far: content, tool calls and the tokens behind them."""

    index: int
    tools: ToolCallText | None  # None: no tools offered, all text is content
    content: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    tokens: list = field(default_factory=list)
    done: Done | None = None
    written: list[str] = field(default_factory=list)  # the text as the model wrote it

    def add(self, text: str, final: bool = False) -> list[tuple]:
        """The parts (`ToolCallText`'s) that `text` releases; `final`: the choice has ended."""
        self.written.append(text)
        parts = self.tools.feed(text) if self.tools else [("text", None, text)] if text else []
        if final and self.tools:
            parts += self.tools.finish()
        for kind, _, value in parts:
            if kind == "text":
                self.content.append(value)
            elif kind in ("call", "end"):
                self.calls.append(value)
        return parts

    def remember(self, produced: ProducedTurns, decode) -> None:
        """Keep the answer as written, found by what the client was shown; not where a call the
        client never saw (a second one where only one may come) is in the text."""
        if not (self.tools and self.tools.dropped):
            answer = as_written("".join(self.written), [t.id for t in self.tokens], decode)
            produced.remember("".join(self.content), self.calls, answer)

    def finish_reason(self) -> str:
        return (
            "tool_calls"
            if self.calls and self.done.finish_reason == "stop"
            else self.done.finish_reason
        )


@dataclass
class ChoiceEvent:
    """One engine event of one choice, as every adapter reads it: the tokens it carries, the parts
    its text released ((kind, call index, value): "text", "begin", "args", "end" or "call", as
    `ToolCallText` names them), and `end`: the choice's Done, the request's Failed, or None.
    `begun`: only the news that the prompt's prefill has begun (nothing generated yet)."""

    choice: ChoiceState
    tokens: list
    parts: list[tuple]
    end: Done | Failed | None = None
    # of the prompt's tokens, those the prompt cache held (known once its prefill began)
    cached: int = 0
    begun: bool = False


@dataclass
class Reply:
    """A queued request's answer: its choices (filled in as the steps come) and the steps."""

    choices: list[ChoiceState]
    steps: AsyncIterator[ChoiceEvent]
    prompt_tokens: int

    async def events(self, start: bool = False) -> AsyncIterator[tuple]:
        """The first choice's answer as plain events, for the dialects of one choice: ("text",
        str), ("call", OpenAI tool call dict), ("begin", a call with arguments ""), ("args", a
        fragment), ("end", the whole call), then ("done", Done), or ("failed", Failed). `start`:
        first ("start", the prompt's tokens the prompt cache held), once known (when the prefill
        begins, or else with the first text or the end)."""
        try:
            async for step in self.steps:
                if start and not isinstance(step.end, Failed):
                    start = False
                    yield "start", step.cached
                if step.begun:
                    continue
                if isinstance(step.end, Failed):
                    yield "failed", step.end
                    return
                for kind, _, value in step.parts:
                    yield kind, value
                if isinstance(step.end, Done):
                    yield "done", step.end
        finally:
            # now, not when collected: it cancels the request on every rank
            await self.steps.aclose()


class Front:
    """Check, tokenize, reserve, submit: the only way a request of any
    dialect reaches the engine."""

    def __init__(
        self,
        engine: EnginePort,
        served: ServedModel,
        metrics: RingMetrics,
        keepalive_s: float = KEEPALIVE_S,
    ):
        self.engine, self.served, self.metrics = engine, served, metrics
        self.keepalive_s = keepalive_s  # seconds between a stream's keep-alives (keepalive.py)
        self.produced = ProducedTurns()
        self.prompts = Prompts(served, self.produced)

    def check(self, body: ChatCompletionRequest) -> dict | None:
        """A chat request checked against the served model (its name, sampling and tools); how its
        answer's tool calls are found (`Prompt.tools`)."""
        check_model(self.served, body.model)
        check_sampling(self.served, body)
        return tool_calls(self.served, body)

    async def chat(self, body: ChatCompletionRequest) -> Prompt:
        """The prompt of a chat request, checked against the served model and templated."""
        tools = self.check(body)
        ids, grammar = await self.prompts.chat(body)
        return Prompt(ids, grammar, tools, templated=True)

    async def completion(self, body: CompletionRequest) -> Prompt:
        """The prompt of a request sent as it is: tokenized, no chat template."""
        check_model(self.served, body.model)
        check_sampling(self.served, body)
        return Prompt(await self.prompts.completion(body))

    def open(self, body, prompt: Prompt, http: HttpRequest, stream_calls: bool = False) -> Reply:
        """Queue a checked request: its answer's steps. A 400 (the completion limit), 429 or 503
        ApiError before anything is queued. `stream_calls`: a call whose format allows it comes as
        begin, args..., end instead of one call part."""
        limit = max_tokens_for(self.served, prompt.ids, body)
        # before any byte is sent: a 429 is a plain answer
        reservation = self._reserve(http, body, prompt.ids, limit)
        try:
            # before any byte is sent: a full queue is a plain 503
            reqs, queue = self._submit(body, prompt, limit)
        except ApiError:
            if reservation:
                settle(reservation, 0)  # refused: it used nothing
            raise
        choices = [
            ChoiceState(
                i, ToolCallText(**prompt.tools, stream=stream_calls) if prompt.tools else None
            )
            for i in range(body.n)
        ]
        flow = self._run(reqs, queue, http, reservation)
        remember = self._remember if prompt.templated else None
        return Reply(choices, _steps(choices, flow, remember), len(prompt.ids))

    def _remember(self, c: ChoiceState) -> None:
        c.remember(self.produced, self.served.tokenizer.decode)

    async def events(
        self,
        body: ChatCompletionRequest,
        http: HttpRequest,
        stream_calls: bool = False,
        start: bool = False,
    ) -> tuple[int, AsyncIterator[tuple]]:
        """(prompt tokens, the answer's events: `Reply.events`, `start` passed on) of a chat
        request from an agent's dialect: max_tokens over the room the prompt leaves is cut to it,
        as agents expect (docs/api.md)."""
        body.clamp_tokens()
        answer = self.open(body, await self.chat(body), http, stream_calls)
        return answer.prompt_tokens, answer.events(start)

    async def raw_events(
        self, body: CompletionRequest, http: HttpRequest
    ) -> tuple[int, AsyncIterator[tuple]]:
        """As `events`, for a prompt sent as it is: tokenized, no chat template."""
        body.clamp_tokens()
        answer = self.open(body, await self.completion(body), http)
        return answer.prompt_tokens, answer.events()

    def _submit(self, body, prompt: Prompt, limit: int) -> tuple[list[Request], asyncio.Queue]:
        """The request's choices, queued together; their events arrive on one asyncio
        queue as (index, event)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        top, reqs = body.logprob_count() or 0, []
        for i in range(body.n):
            reqs.append(
                Request(
                    prompt.ids,
                    limit,
                    body.sampling(top, i, prompt.grammar),
                    stop=body.stops(),
                    emit=lambda ev, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, ev)),
                    # the others start from the first's cached prompt
                    after=reqs[0] if reqs else None,
                )
            )
        try:
            self.engine.submit(*reqs)
        except QueueFull as e:
            raise ApiError(
                503,
                f"the server is busy ({e}); retry shortly",
                "server_overloaded",
                headers={"Retry-After": "1"},
            ) from None
        except Unavailable as e:
            raise ApiError(
                503,
                f"the server is not taking requests: {e}",
                "service_unavailable",
                headers={"Retry-After": "5"},
            ) from None
        return reqs, events

    def _reserve(self, http: HttpRequest, body, prompt: list[int], limit: int) -> list | None:
        """The request's tokens (prompt + n x its completion limit) against its
        key's tokens per minute."""
        key = getattr(http.state, "key", None)
        if key is None:
            return None
        try:
            return reserve_tokens(key, len(prompt) + body.n * limit)
        except RateLimited as e:
            raise ApiError(
                429,
                str(e),
                e.kind,
                code="rate_limit_exceeded",
                headers={"Retry-After": str(e.retry_after)},
            ) from None

    async def _run(
        self,
        reqs: list[Request],
        events: asyncio.Queue,
        http: HttpRequest,
        reservation: list | None,
    ):
        """Yield (index, event) for every choice until all are done or one fails; on exit every
        choice is marked cancelled (a no-op once finished), which frees it on every rank."""

        async def watch_disconnect():
            # The body is already read, so the next ASGI message is the client hanging up.
            while (await http.receive())["type"] != "http.disconnect":
                pass
            self.engine.cancel(*reqs)

        watcher = asyncio.create_task(watch_disconnect())
        clocks, running, used, failed = (
            [Clock(self.metrics) for _ in reqs],
            set(range(len(reqs))),
            len(reqs[0].prompt),
            True,
        )
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
            # failed or cancelled: what the choices used is unknown, the prompt is counted
            if reservation:
                settle(reservation, len(reqs[0].prompt) if failed else used)
            watcher.cancel()
            self.engine.cancel(*reqs)


async def _steps(
    choices: list[ChoiceState], flow, remember: Callable[[ChoiceState], None] | None
) -> AsyncIterator[ChoiceEvent]:
    """The engine's (index, event) flow as steps, each choice's text split into its parts; each
    finished answer given to `remember`."""
    try:
        async for i, ev in flow:
            c = choices[i]
            if isinstance(ev, Failed):
                yield ChoiceEvent(c, [], [], ev)
                return
            if isinstance(ev, Started):
                yield ChoiceEvent(c, [], [], cached=ev.cached_tokens, begun=True)
                continue
            if isinstance(ev, Done):
                c.done = ev
            tokens = ev.tokens if isinstance(ev, Delta) else []
            c.tokens += tokens
            parts = c.add(ev.text if isinstance(ev, Delta) else "", final=isinstance(ev, Done))
            if isinstance(ev, Done) and remember is not None:
                remember(c)
            yield ChoiceEvent(
                c, tokens, parts, ev if isinstance(ev, Done) else None, ev.cached_tokens
            )
    finally:
        await flow.aclose()  # now, not when collected: it cancels the request on every rank
