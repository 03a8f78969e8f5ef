"""Pieces of OpenAI's chat and text completions built from the engine's events: logprobs,
usage, server-sent events."""

import json
import math
from typing import Callable

from mlx_ring.serving.port import Done


def finite(lp: float) -> float:
    # as OpenAI reports impossible tokens; JSON has no -inf
    return lp if math.isfinite(lp) else -9999.0


def chat_logprobs(tokens, top: int | None, token_text: Callable[[int], str]):
    """The `logprobs` of a chat choice (None: not asked for); `token_text` decodes one token id."""
    if top is None:
        return None
    content = []
    for t in tokens:
        s = token_text(t.id)
        content.append(
            {
                "token": s,
                "logprob": finite(t.logprob),
                "bytes": list(s.encode()),
                "top_logprobs": [
                    {
                        "token": token_text(i),
                        "logprob": finite(lp),
                        "bytes": list(token_text(i).encode()),
                    }
                    for i, lp in t.top[:top]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(tokens, top: int | None, token_text: Callable[[int], str]):
    """The `logprobs` of a completion choice (None: not asked for)."""
    if top is None:
        return None
    return {
        "tokens": [token_text(t.id) for t in tokens],
        "token_logprobs": [finite(t.logprob) for t in tokens],
        "top_logprobs": [{token_text(i): finite(lp) for i, lp in t.top[:top]} for t in tokens]
        if top
        else None,
    }


def usage(done: list[Done]) -> dict:
    """The prompt once (the choices of a request share its prefill), the completions
    of every choice; of the prompt, the tokens the prompt cache held (`cached_tokens`,
    as OpenAI reports them)."""
    p, c = done[0].prompt_tokens, sum(d.completion_tokens for d in done)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": done[0].cached_tokens},
    }


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
