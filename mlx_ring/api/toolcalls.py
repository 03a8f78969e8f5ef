"""Tool calls out of one choice's generated text, as it streams: the text between the markers of
the model's chat template goes to mlx-lm's own parser for that family (`TokenizerWrapper.tool_parser`),
and comes out in OpenAI's shape. No MLX here."""

import json
import logging
import uuid

from mlx_ring.serving.textstream import partial_tail

log = logging.getLogger(__name__)


class ToolCallText:
    """Feed a choice's text; get back (plain content, new tool calls) as soon as each is known.
    `single`: parallel_tool_calls false, so calls after the first are not returned."""

    def __init__(self, start: str, end: str, parse, tools: list[dict], single: bool = False):
        self.start, self.end, self.parse, self.tools, self.single = start, end, parse, tools, single
        self.buf, self.inside, self.calls = "", False, 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self.buf += text
        content, calls = "", []
        while True:
            if not self.inside:
                i = self.buf.find(self.start)
                if i < 0:
                    keep = partial_tail(self.buf, [self.start])
                    content, self.buf = content + self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                    return content, calls
                content, self.buf, self.inside = content + self.buf[:i], self.buf[i + len(self.start) :], True
            else:
                j = self.buf.find(self.end)
                if j < 0:
                    return content, calls
                body, self.buf, self.inside = self.buf[:j], self.buf[j + len(self.end) :], False
                parsed, failed = self._parse(body)
                content, calls = content + failed, calls + parsed

    def finish(self) -> tuple[str, list[dict]]:
        """The rest, once the choice ends: a call whose end marker never came (the model stopped
        right after it) is parsed all the same; text that does not parse stays content."""
        rest, self.buf = self.buf, ""
        if not self.inside:
            return rest, []
        self.inside = False
        parsed, failed = self._parse(rest)
        return failed, parsed

    def _parse(self, body: str) -> tuple[list[dict], str]:
        try:
            parsed = self.parse(body, self.tools)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # json.JSONDecodeError is a ValueError
            log.warning("a tool call did not parse (%s); it stays in the answer's text", e)
            return [], self.start + body + self.end
        calls = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if self.single and self.calls:
                break
            args = call.get("arguments", {})
            calls.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": call["name"], "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
            self.calls += 1
        return calls, ""
