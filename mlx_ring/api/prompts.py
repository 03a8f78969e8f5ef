"""Requests turned into the model's token ids: the chat template or the tokenizer, run off the event
loop (tokenizing a long prompt takes a while: 100k tokens ~0.2 s here), which keeps streaming
meanwhile, then checked against the served model."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

from mlx_ring.api.chat import found_written, output_grammar, template_messages
from mlx_ring.api.errors import ApiError
from mlx_ring.api.openai_request import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.produced import ProducedTurns, splice
from mlx_ring.api.served import ServedModel, check_ids, check_text_length


class Prompts:
    def __init__(self, served: ServedModel, produced: ProducedTurns | None = None):
        self.served = served
        # this server's recent answers as the model wrote them (produced.py)
        self.produced = produced
        # One thread: a Hugging Face tokenizer is not safe to reconfigure from several threads at
        # once, and the chat template path may.
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        served.max_prompt_chars  # reads the whole vocabulary once: now, not on the event loop

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def chat(self, body: ChatCompletionRequest) -> tuple[list[int], str | None]:
        """(the templated prompt's ids, the grammar the answer must match or None)."""
        check_text_length(self.served, "messages", sum(len(m.text()) for m in body.messages))
        grammar = await self._off_loop(output_grammar, self.served, body)
        prompt = await self._off_loop(self._template, body)
        # a tokenizer may know ids (added tokens) the model has no row for
        check_ids(self.served, "messages", prompt)
        return prompt, grammar

    async def completion(self, body: CompletionRequest) -> list[int]:
        if isinstance(body.prompt, str):
            check_text_length(self.served, "prompt", len(body.prompt))
        prompt = (
            body.prompt
            if isinstance(body.prompt, list)
            else await self._off_loop(self._encode, body.prompt)
        )
        if not prompt:
            raise ApiError(400, "prompt: must be non-empty text or token ids", param="prompt")
        check_ids(self.served, "prompt", prompt)
        return prompt

    def _template(self, body: ChatCompletionRequest) -> list[int]:
        tools = [t.model_dump(exclude_none=True) for t in body.offered_tools()]
        kw = {"add_generation_prompt": True, **({"tools": tools} if tools else {})}
        tok = self.served.tokenizer
        found = found_written(body.messages, self.produced) if self.produced else []
        if any(found):
            try:
                text = tok.apply_chat_template(
                    template_messages(body.messages, found), tokenize=False, **kw
                )
                return splice(text, [w for w in found if w], self._encode_plain)
            except Exception:
                pass  # a template may insist on tool_calls beside a tool result: render as sent
        try:
            return tok.apply_chat_template(template_messages(body.messages), tokenize=True, **kw)
        except Exception as e:
            raise ApiError(
                400, f"messages: cannot apply the chat template: {e}", param="messages"
            ) from None

    def _encode_plain(self, text: str) -> list[int]:
        """A rendered template's text as `apply_chat_template` tokenizes it: its special tokens
        are in the text."""
        return self.served.tokenizer.encode(text, add_special_tokens=False)

    def _encode(self, text: str) -> list[int]:
        try:
            return self.served.tokenizer.encode(text)
        except Exception as e:  # e.g. a lone surrogate escaped in the JSON
            raise ApiError(400, f"prompt: cannot be tokenized: {e}", param="prompt") from None
