"""One running request's answer on rank 0: its sequence, the text its tokens make (`TextStream`,
stop strings included) and where it ends (an end token, max_tokens, a stop string), sent to its
request as events (`Request.emit`). The engine thread alone drives it."""

import logging
import time

from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlx_ring.serving.port import Delta, Done, Request, Started
from mlx_ring.serving.rows import Sequence
from mlx_ring.serving.sampling import Token
from mlx_ring.serving.textstream import Piece, TextStream, Tokens

log = logging.getLogger(__name__)


class Answer:
    """Bookkeeping of one running request: its sequence and the text it has produced."""

    def __init__(self, req: Request, seq: Sequence, tokenizer: TokenizerWrapper | None):
        """`tokenizer` None: tokens only, no text and no stop strings (the HTTP process's)."""
        self.req, self.seq = req, seq
        self.t0 = time.perf_counter()
        self.text = TextStream(tokenizer.detokenizer, req.stop) if tokenizer else Tokens()
        self.count = 0
        self.started = False  # told that its prefill has begun

    def start(self) -> None:
        """Tell the request, once, that its prefill has begun (its cached start now known)."""
        if not self.started:
            self.started = True
            self.req.emit(Started(self.seq.cached))

    def add(self, token: Token, eos_ids) -> Done | None:
        """Send `token`'s text on; returns how the answer ends where it ends with this token."""
        self.count += 1
        if self.count == 1:
            log.debug(
                "sequence %d: first token after %.3f s", self.seq.id, time.perf_counter() - self.t0
            )
        prompt = len(self.req.prompt)
        # counted in usage; no logprobs entry, as it is not in the text
        if token.id in eos_ids:
            self._send(self.text.end())
            return Done("stop", prompt, self.count, self.seq.cached)
        self._send(self.text.add(token.id, token))
        if not self.text.closed and self.count >= self.req.max_tokens:
            self._send(self.text.end())
            if not self.text.stop_hit:
                return Done("length", prompt, self.count, self.seq.cached)
        if self.text.closed:
            return Done("stop", prompt, self.count, self.seq.cached, self.text.stop_hit)
        return None

    def _send(self, piece: Piece | None) -> None:
        if piece is not None:
            self.req.emit(Delta(piece.text, piece.tokens, self.seq.cached))
