"""One request's tokens turned into text as a client sees it: streaming detokenization, stop
strings, and the end of a sequence. Pure Python over mlx-lm's detokenizers; no MLX, no ring."""

from dataclasses import dataclass, field


def partial_tail(text: str, markers: list[str]) -> int:
    """Length of the longest end of `text` that could still grow into one of `markers` (a stop
    string, a tool-call marker): text to hold back until more arrives."""
    keep = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), keep, -1):
            if text.endswith(m[:n]):
                keep = n
                break
    return keep


@dataclass
class Piece:
    """Text ready to send, and the tokens it came from (for logprobs)."""

    text: str
    tokens: list = field(default_factory=list)


class TextStream:
    """Feed tokens with `add`; each call returns what may be sent now. `end()` closes the
    text at the end of a sequence (end token, length limit): the detokenizer hands over
    what it still holds."""

    def __init__(self, detokenizer, stop: list[str]):
        self.detok = detokenizer
        self.detok.reset()
        self.stop = stop
        self.held = ""  # text that could still be the start of a stop string
        self.held_tokens: list = []
        self.stop_hit: str | None = None  # the stop string that ended the text
        self.closed = False  # nothing more is sent

    def add(self, token_id: int, token=None) -> Piece | None:
        """Add one generated token; `token` (any object) rides along with the text it produced.
        After the call, `stop_hit` is the stop string that ended the text, if one did."""
        assert not self.closed, "a closed stream takes no more tokens"
        self.detok.add_token(token_id)
        self.held += self.detok.last_segment
        self.held_tokens.append(token if token is not None else token_id)
        return self._close() if self._cut_at_stop() else self._flush(final=False)

    def end(self) -> Piece | None:
        """The sequence is over (end token or length limit): flush what the detokenizer still holds
        back (a partial multi-byte character, a trailing space, an SPM tokenizer's last word)."""
        if self.closed:
            return None
        self.detok.finalize()
        self.held += self.detok.last_segment
        self._cut_at_stop()
        return self._close()

    def _close(self) -> Piece | None:
        self.closed = True
        return self._flush(final=True)

    def _cut_at_stop(self) -> bool:
        # the first in the text; of two starting there, the longer (it holds the other)
        hits = sorted((i, -len(s), s) for s in self.stop if (i := self.held.find(s)) >= 0)
        if hits:
            self.held = self.held[: hits[0][0]]
            self.stop_hit = hits[0][2]
        return bool(hits)

    def _flush(self, final: bool) -> Piece | None:
        keep = 0 if final else partial_tail(self.held, self.stop)
        text = self.held[: len(self.held) - keep]
        if not (text or (final and self.held_tokens)):
            return None
        piece = Piece(text, self.held_tokens)
        self.held, self.held_tokens = self.held[len(text) :], []
        return piece


class Tokens:
    """`TextStream`'s stand-in where the text is made elsewhere (the HTTP process): every token
    passes on at once with no text, and nothing ends the answer but its end token or length."""

    stop_hit = None
    closed = False

    def add(self, token_id: int, token=None) -> Piece:
        return Piece("", [token if token is not None else token_id])

    def end(self) -> None:
        return None
