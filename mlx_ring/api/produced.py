"""What the model wrote for its recent answers, so that an answer sent back in a later turn's
history renders as the tokens the model produced, not as the chat template re-renders it.

A template writes a call's arguments with its own `tojson` (spacing, key order) and may move text
around the calls, and text the model wrote under a grammar need not tokenize back to the tokens it
chose; either way the prompt cache, which matches tokens, would miss from there. An answer is found
again by what the client can send back: its text (surrounding white space aside) and its calls
(names and arguments compared as JSON values, so a client that reorders keys still finds it).
No MLX here."""

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable

# What is kept, in characters and ids: the recent answers of many long agent sessions.
MAX_CHARS = 32 << 20


def answer_key(text: str, calls: Iterable[tuple[str, str]]) -> bytes:
    """The key of an answer with visible `text` and `calls` as (name, arguments as JSON text)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(text.strip().encode("utf-8", "surrogatepass"))
    for name, args in calls:
        h.update(b"\0" + name.encode() + b"\0" + _canonical(args).encode("utf-8", "surrogatepass"))
    return h.digest()


def _canonical(args: str) -> str:
    try:
        value = json.loads(args)
    except (json.JSONDecodeError, TypeError):
        return str(args)  # not JSON: compared as the text it is
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def call_pairs(calls: list[dict]) -> list[tuple[str, str]]:
    """(name, arguments) of calls in OpenAI's shape."""
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


@dataclass(frozen=True)
class Written:
    """An answer as the model wrote it: its whole text, and the token ids behind that text (None
    where they do not decode to it, e.g. a stop string cut a token)."""

    text: str
    ids: tuple[int, ...] | None

    def size(self) -> int:
        return len(self.text) + len(self.ids or ())


def as_written(text: str, ids: list[int], decode) -> Written:
    """The answer `text` as written, with the `ids` generated for it where they decode to it (the
    end token, which the text leaves out, dropped)."""
    for n in (len(ids), len(ids) - 1):
        if n >= 0 and decode(ids[:n]) == text:
            return Written(text, tuple(ids[:n]))
    return Written(text, None)


def splice(text: str, turns: list[Written], encode) -> list[int]:
    """The ids of a rendered prompt `text`, each of `turns` (in the order they appear) as the ids
    it was written with; a turn not found as it was written is tokenized with the rest."""
    ids, at = [], 0
    for t in turns:
        start = text.find(t.text, at) if t.ids is not None and t.text else -1
        if start < 0:
            continue
        ids += encode(text[at:start]) + list(t.ids)
        at = start + len(t.text)
    return ids + encode(text[at:])


class ProducedTurns:
    """Recent answers as written, by `answer_key`, least recently used dropped first."""

    def __init__(self, max_chars: int = MAX_CHARS):
        self.max_chars = max_chars
        self._turns: OrderedDict[bytes, Written] = OrderedDict()
        self._size = 0

    def remember(self, text: str, calls: list[dict], answer: Written) -> None:
        """Keep `answer` for the answer shown to the client as `text` and `calls`."""
        if answer.size() > self.max_chars:
            return
        key = answer_key(text, call_pairs(calls))
        old = self._turns.pop(key, None)
        self._size += answer.size() - (old.size() if old is not None else 0)
        self._turns[key] = answer
        while self._size > self.max_chars:
            self._size -= self._turns.popitem(last=False)[1].size()

    def recall(self, text: str, calls: list[tuple[str, str]]) -> Written | None:
        """The answer shown as `text` and `calls` (name, arguments) as written, if it is one of
        this server's."""
        key = answer_key(text, calls)
        answer = self._turns.get(key)
        if answer is not None:
            self._turns.move_to_end(key)
        return answer

    def __len__(self) -> int:
        return len(self._turns)
