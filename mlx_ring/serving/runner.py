"""Running rank 0's part of a step that came home: the head on its hidden states, sampling, and the
verification of drafts. What the tokens then change (sequences, groups, the prompt cache) is the
scheduler's postprocessing (`scheduler.py`); what goes out next is the chooser's (`choosing.py`)."""

from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

from mlx_ring.ring.handle import RingHandle
from mlx_ring.serving.choosing import Ends
from mlx_ring.serving.rows import Sequence, Step
from mlx_ring.serving.sampling import Token, read_tokens, sample_lazy, sample_rows
from mlx_ring.serving.speculative import verify_rows


@dataclass
class Ran:
    """What rank 0 made of one step: each row's tokens in order (for a row whose sampling failed,
    the error), and for a verification, the positions each row's cache drops and the drafts kept."""

    tokens: list[tuple[Sequence, Token | Exception]]
    drops: list[int] | None = None
    accepted: int = 0


class Runner:
    """Rank 0's head and samplers over the steps that come home on `pipe`."""

    def __init__(self, pipe: RingHandle, ends: Ends):
        self.pipe, self.ends = pipe, ends

    def prefill(self, step: Step, out: mx.array) -> Ran:
        """A prefill batch's last chunk: every row's first token."""
        b = step.prefill
        # a batch of padded prompts comes back whole: take each row's last token
        if out.shape[1] > 1:
            last = mx.array([[[len(s.prompt) - 1 - step.offset]] for s in b.rows])
            out = mx.take_along_axis(out, last, axis=1)  # (B, 1, H)
        logits = self.ends.head(out)[:, -1, :]  # (B, V)
        return Ran(list(zip(b.rows, sample_rows([s.sampler for s in b.rows], logits))))

    def decode(
        self, step: Step, out: mx.array, chain: Callable[[mx.array], None] | None = None
    ) -> Ran:
        """A decode step: every row's next token. `chain`: where the group's next step may go out on
        the sampled ids before they are read, the function that submits it."""
        samplers = [s.sampler for s in step.rows]
        logits = self.ends.head(out)[:, -1, :]  # (B, V)
        if chain is not None:
            # Build and start the group's next step on the ids before reading them (as mlx-lm's
            # generate loop does): rank 0 then handles these tokens while that step computes.
            # Rows that finish now compute one token more, which is dropped.
            drawn = sample_lazy(samplers, logits)
            self.pipe.prefetch(*drawn.arrays())
            chain(mx.expand_dims(drawn.ids, 1))
            tokens = read_tokens(samplers, drawn)
        else:
            self.pipe.settle()  # the payload, off the socket before it is read
            tokens = sample_rows(samplers, logits)
        return Ran(list(zip(step.rows, tokens)))

    def verify(self, step: Step, out: mx.array) -> Ran:
        """A decode step that carried drafts: each row keeps its accepted drafts and one more token
        (`speculative.verify_rows`)."""
        logits = self.ends.head(out)  # (B, 1 + width, V)
        self.pipe.settle()
        results, drops, accepted = verify_rows(step.rows, logits, step.drafts)
        return Ran(results, drops, accepted)
