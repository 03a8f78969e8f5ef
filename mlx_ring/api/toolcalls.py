"""Tool calls out of one choice's generated text, as it streams: the text between the markers
of the model's chat template goes to mlx-lm's own parser for that family
(`TokenizerWrapper.tool_parser`), and comes out in OpenAI's shape. Calls in mlx-lm's JSON
format can also be read as they are generated, their arguments handed out in fragments
(`JsonCall`). No MLX here."""

import json
import logging
import string
import uuid

from mlx_ring.serving.textstream import partial_tail

log = logging.getLogger(__name__)

# <tool_call>{"name": ..., "arguments": {...}}</tool_call>
JSON_TOOLS = "mlx_lm.tool_parsers.json_tools"
# numbers, true/false/null, NaN/Infinity
BARE = frozenset(string.ascii_letters + string.digits + "+-.")


def new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallText:
    """Feed a choice's text; get back its parts as soon as each is known, as (kind, call index,
    value): ("text", None, plain content), ("call", n, a whole tool call) and, with `stream`
    where the model's format allows, ("begin", n, the call with its id and name and arguments
    ""), ("args", n, the next fragment of its arguments) and ("end", n, the whole call, its
    arguments those fragments joined). `single`: parallel_tool_calls false, so calls after the
    first are not returned."""

    def __init__(
        self,
        start: str,
        end: str,
        parse,
        tools: list[dict],
        single: bool = False,
        stream: bool = False,
    ):
        self.start, self.end, self.parse, self.tools, self.single = start, end, parse, tools, single
        self.stream = stream and getattr(parse, "__module__", None) == JSON_TOOLS
        self.buf, self.inside, self.calls = "", False, 0
        self.dropped = False  # a call left out (`single`): the text holds more than was returned
        self.reading: JsonCall | None = None  # the call being read as it comes
        self.head: dict | None = None  # its "begin" part

    def feed(self, text: str) -> list[tuple]:
        self.buf += text
        parts = []
        while True:
            if not self.inside:
                i = self.buf.find(self.start)
                if i < 0:
                    keep = len(self.buf) - partial_tail(self.buf, [self.start])
                    parts += _text(self.buf[:keep])
                    self.buf = self.buf[keep:]
                    return parts
                parts += _text(self.buf[:i])
                self.buf, self.inside = self.buf[i + len(self.start) :], True
                if self.stream and not (self.single and self.calls):
                    self.reading = JsonCall()
            else:
                j = self.buf.find(self.end)
                if j < 0:
                    if self.reading:  # all but what may be the start of the end marker
                        keep = len(self.buf) - partial_tail(self.buf, [self.end])
                        parts += self._read(self.buf[:keep])
                        self.buf = self.buf[keep:]
                    return parts
                body, self.buf, self.inside = self.buf[:j], self.buf[j + len(self.end) :], False
                parts += self._close(body)

    def finish(self) -> list[tuple]:
        """The rest, once the choice ends: a call whose end marker never came (the model stopped
        right after it) is parsed all the same; text that does not parse stays content."""
        rest, self.buf = self.buf, ""
        if not self.inside:
            return _text(rest)
        self.inside = False
        return self._close(rest)

    def _read(self, text: str) -> list[tuple]:
        parts = []
        for kind, value in self.reading.feed(text):
            if kind == "begin":
                self.head = {
                    "id": self.reading.id or new_id(),
                    "type": "function",
                    "function": {"name": self.reading.name, "arguments": ""},
                }
                parts.append(("begin", self.calls, self.head))
            else:
                parts.append(("args", self.calls, value))
        return parts

    def _close(self, body: str) -> list[tuple]:
        """The parts a call's last text releases; `body`: its text not yet read."""
        reading = self.reading
        if reading is None:
            return self._parse(body)
        parts = self._read(body)
        self.reading = None
        if not reading.begun:  # nothing was sent: the call is parsed whole, as without streaming
            return self._parse(reading.raw)
        call = self.head | {
            "function": self.head["function"] | {"arguments": "".join(reading.sent)}
        }
        self._compare(reading, call)
        self.calls += 1
        return parts + [("end", self.calls - 1, call)]

    def _compare(self, reading: "JsonCall", call: dict) -> None:
        """A warning where the streamed call is not what the whole text parses to:
        what was sent stays."""
        try:
            parsed = self._parse_one(reading.raw)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            parsed = e
        if not reading.closed:
            log.warning(
                (
                    "a streamed tool call ended before its JSON did; its arguments "
                    "are as far as they came"
                )
            )
        elif not isinstance(parsed, dict) or parsed["function"] != call["function"]:
            log.warning(
                (
                    "a streamed tool call differs from its whole text's parse (%s); "
                    "the streamed call stays"
                ),
                parsed,
            )

    def _parse_one(self, body: str) -> dict:
        parsed = self.parse(body, self.tools)
        call = parsed[0] if isinstance(parsed, list) else parsed
        return _openai(call)

    def _parse(self, body: str) -> list[tuple]:
        try:
            parsed = self.parse(body, self.tools)
        # json.JSONDecodeError is a ValueError
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("a tool call did not parse (%s); it stays in the answer's text", e)
            return _text(self.start + body + self.end)
        parts = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if self.single and self.calls:
                self.dropped = True
                break
            parts.append(("call", self.calls, _openai(call)))
            self.calls += 1
        return parts


def _text(text: str) -> list[tuple]:
    return [("text", None, text)] if text else []


def _openai(call: dict) -> dict:
    """A call as mlx-lm's parser gives it, in OpenAI's shape: its arguments as JSON text."""
    args = call.get("arguments", {})
    return {
        "id": call.get("id") or new_id(),
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        },
    }


class JsonCall:
    """One call in mlx-lm's JSON format (`{"name": ..., "arguments": {...}}`) read as it is
    generated. `feed` returns what became known: ("begin", None) once the name is complete and
    the arguments have started, then ("args", text): fragments of exactly the text
    `json.dumps(arguments, ensure_ascii=False)` gives, as a whole parse makes it, each token
    written as json.dumps writes it and strings as they come. Arguments that are no object, or
    text that is no such call before anything was sent, leave `begun` False: the call is then
    parsed whole. Text that breaks the JSON after that ends the reading; what was sent stays."""

    def __init__(self):
        self.raw, self.at = "", 0  # the call's text so far; how far it is read
        self.stack: list[list] = []  # open containers: [bracket, what comes next, last key]
        self.closed = self.stopped = self.begun = False
        self.name = self.id = None
        self.args: str | None = None  # None: not started, "open", "done"
        # inside a string of the arguments: where its unsent text starts
        self.string: int | None = None
        self.pending: list[str] = []  # argument text read
        self.sent: list[str] = []  # argument text handed out

    def feed(self, text: str) -> list[tuple]:
        self.raw += text
        while not self.stopped and self.at < len(self.raw) and self._step():
            pass
        if self.closed and self.args is None:  # no arguments: the parse's default, {}
            self.args, self.pending = "done", ["{}"]
        out = []
        if not self.begun and self.name is not None and self.args is not None:
            self.begun = True
            out.append(("begin", None))
        if self.begun and self.pending:
            out.append(("args", "".join(self.pending)))
            self.sent += self.pending
            self.pending = []
        return out

    def _stop(self) -> bool:
        self.stopped = True
        return False

    def _emit(self, text: str) -> None:
        if self.args == "open":
            self.pending.append(text)

    def _step(self) -> bool:
        """Read one token if it is complete; False when more text is needed
        or the reading stopped."""
        if self.string is not None:
            return self._string()
        raw, i = self.raw, self.at
        c = raw[i]
        if c in " \t\r\n":
            self.at += 1
            return True
        if not self.stack and (self.closed or c != "{"):  # text after the call, or no object
            return self._stop()
        if c == '"':
            top = self.stack[-1]
            # a string of the arguments: sent as it comes
            if self.args == "open" and top[1] in ("value", "value_or_end"):
                self.at = self.string = i + 1
                return self._token('"')
            _, end = _scan_string(raw, i + 1)
            if end < 0:
                return False
            try:
                value = json.loads(raw[i : end + 1])
            except ValueError:
                return self._stop()
            self.at = end + 1
            return self._token("str", value)
        if c in "{}[],:":
            self.at += 1
            return self._token(c)
        j = i
        while j < len(raw) and raw[j] in BARE:
            j += 1
        if j == len(raw):
            return False  # a number may go on
        try:
            value = json.loads(raw[i:j])
        except ValueError:
            return self._stop()
        self.at = j
        return self._token("bare", value)

    def _string(self) -> bool:
        """Send what has come of an argument string, up to its closing quote."""
        start = self.string
        safe, end = _scan_string(self.raw, start)
        upto = end if end >= 0 else safe
        if upto > start:
            try:
                text = json.loads('"' + self.raw[start:upto] + '"')
            except ValueError:  # a control character or a bad escape: no JSON
                return self._stop()
            self._emit(json.dumps(text, ensure_ascii=False)[1:-1])
        if end < 0:
            self.at = self.string = safe
            return False
        self._emit('"')
        self.string, self.at = None, end + 1
        return True

    def _token(self, kind: str, value=None) -> bool:
        """One token against JSON's grammar: what the call's fields are, what
        the arguments' text is."""
        if not self.stack:
            self.stack.append(["{", "key_or_end", None])
            return True
        top = self.stack[-1]
        bracket, want, key = top
        if kind in ("str", "bare", "{", "[", '"'):
            if bracket == "{" and want in ("key_or_end", "key"):
                if kind != "str":
                    return self._stop()
                top[1], top[2] = "colon", value
                self._emit(json.dumps(value, ensure_ascii=False))
                return True
            if want not in ("value", "value_or_end"):
                return self._stop()
            top[1] = "comma_or_end"
            if len(self.stack) == 1:  # a field of the call
                if key == "arguments" and self.args is None:
                    if kind != "{":
                        return self._stop()  # only an object's text is streamed
                    self.args = "open"
                elif key == "name" and self.name is None:
                    if kind != "str":
                        return self._stop()
                    self.name = value
                elif key == "id" and self.id is None and kind == "str":
                    self.id = value
            self._emit(json.dumps(value, ensure_ascii=False) if kind in ("str", "bare") else kind)
            if kind in ("{", "["):
                self.stack.append([kind, "key_or_end" if kind == "{" else "value_or_end", None])
            return True
        if kind in ("}", "]"):
            if want not in ("key_or_end", "value_or_end", "comma_or_end") or bracket != (
                "{" if kind == "}" else "["
            ):
                return self._stop()
            self._emit(kind)
            self.stack.pop()
            if len(self.stack) == 1 and self.args == "open":
                self.args = "done"
            self.closed = not self.stack
            return True
        if kind == "," and want == "comma_or_end":
            top[1] = "key" if bracket == "{" else "value"
            self._emit(", ")
            return True
        if kind == ":" and want == "colon":
            top[1] = "value"
            self._emit(": ")
            return True
        return self._stop()


def _scan_string(s: str, i: int) -> tuple[int, int]:
    """(how far from `i` a JSON string's text is whole, where its closing quote is or -1): never
    inside an escape, nor between the two escapes of a surrogate pair."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            return i, i
        if c != "\\":
            i += 1
            continue
        if i + 1 >= n:
            return i, -1
        if s[i + 1] != "u":
            i += 2
            continue
        if i + 6 > n:
            return i, -1
        # a high surrogate: its low half may follow
        if s[i + 2 : i + 4].lower() in ("d8", "d9", "da", "db"):
            if i + 7 > n or (s[i + 6] == "\\" and (i + 8 > n or (s[i + 7] == "u" and i + 12 > n))):
                return i, -1
        i += 6
    return i, -1
