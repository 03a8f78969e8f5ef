"""Keep-alives while a prompt prefills: a long prompt's prefill takes minutes, and a client whose
stream has carried nothing that long may give up on it. Each dialect's stream sends its own kind
(docs/api.md) every `KEEPALIVE_S` seconds, from the moment the request is queued until its first
token or its error; `beating` says when."""

import asyncio
from typing import AsyncIterator, Callable

KEEPALIVE_S = 5.0  # seconds between keep-alives: well within any client's read timeout
SSE_COMMENT = ": keep-alive\n\n"  # a server-sent events comment, which OpenAI's clients skip
_END = object()


async def beating(
    flow: AsyncIterator, every: float, waiting: Callable[[object], bool] = lambda item: False
) -> AsyncIterator:
    """`flow`'s items, with None for each `every` seconds that pass without one until the first
    item that `waiting` says is not news of a prefill still under way (the first token or an
    error); from there on, `flow`'s items alone."""
    pending = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(flow, _END))
            while not (await asyncio.wait({pending}, timeout=every))[0]:
                yield None
            item, pending = pending.result(), None
            if item is _END:
                return
            yield item
            if not waiting(item):
                break
        async for item in flow:
            yield item
    finally:
        if pending is None or pending.done():
            await flow.aclose()  # now, not when collected: it cancels the request on every rank
        else:
            pending.cancel()  # the flow then closes in that task, which cancels the request
