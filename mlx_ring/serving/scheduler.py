"""Continuous batching on rank 0, one step at a time: choose the work that goes round the ring next
(`choosing.py`), run rank 0's part of the oldest step when it comes home (`runner.py`: the head,
sampling, the verification of drafts), then postprocess its tokens: into their sequences, a prefill
batch into its decode group and the prompt cache, rejected drafts out of every rank's cache. The
caller calls `step()` in a loop and decides when sequences stop.
"""

import mlx.core as mx

from mlx_ring.ring.handle import RingHandle
from mlx_ring.ring.protocol import Kind
from mlx_ring.serving.choosing import Chooser, Ends
from mlx_ring.serving.rows import Group, Sequence, Step
from mlx_ring.serving.runner import Ran, Runner
from mlx_ring.serving.sampling import Token

# calls that read or change a decode group's caches
TOUCH = (Kind.SAVE_ROW, Kind.TRIM)


class Scheduler(Chooser):
    """The chooser's lanes, with rank 0's runner for the steps that come home; the keyword
    arguments are `Chooser`'s."""

    def __init__(self, pipe: RingHandle, ends: Ends, **lanes):
        super().__init__(pipe, ends, **lanes)
        self.runner = Runner(pipe, ends)
        self.drafted = self.accepted = 0  # draft tokens verified and kept, since the start (status)

    def step(self) -> list[tuple[Sequence, Token | Exception]]:
        """Fill the ring with ready work, then take the oldest step home; returns the tokens it gave
        (or, for a row whose sampling failed, the error: the caller removes that sequence)."""
        self.schedule()
        if not self.pipe.outstanding():
            return []
        step, out = self.pipe.collect()  # the oldest step, tagged with what to do with it
        if not self._gives_tokens(step, out):
            return []
        return self.postprocess(step, self.run(step, out))

    def _gives_tokens(self, step: Step, out: mx.array | None) -> bool:
        """Whether rank 0 runs the head on `step`: a call's result goes to its caller, and a prefill
        chunk before the last, or of a batch every client left, gives no token."""
        if step.done is not None:
            step.done(out)
            return False
        if step.kind == Kind.PREFILL:
            b = step.prefill
            b.chunks_out -= 1
            b.home = step.offset + step.tokens // len(b.rows)  # chunks come home in order
            if out is not None:
                # a ring's step is back, so done; alone, the chunk is done on the device first
                mx.eval(out)
            self.prefill_out -= step.tokens
            if self.prefix and not step.last_chunk:
                self._save_home(b)
            if b.removed() or not step.last_chunk:
                if b.removed() and not b.chunks_out and b is not self.filling:
                    self._drop(b)
                return False
            return True
        return step.kind == Kind.DECODE

    def _save_home(self, b) -> None:
        """The whole blocks of `b`'s prompts whose chunks are home, saved now: each rank's disk
        takes a long prompt's blocks while it prefills, not in one burst at its end that the write
        queue's bound would cut short, and (an index of whole blocks) holds the states it noted
        at their ends for a few chunks only."""
        rows = []
        for row, s in enumerate(b.rows):
            end = min(b.home, len(s.prompt)) // self.prefix.block * self.prefix.block
            if end > s.saved and not s.removed:
                rows.append((row, s.prompt[:end], s.saved))
                s.saved = end
        if rows:
            self._save(Kind.SAVE, b.id, rows)

    def run(self, step: Step, out: mx.array) -> Ran:
        """Rank 0's part of a prefill batch's last chunk or of a decode step."""
        if step.kind == Kind.PREFILL:
            return self.runner.prefill(step, out)
        if step.drafts is not None:
            return self.runner.verify(step, out)
        return self.runner.decode(step, out, self._chain(step.group, step.rows))

    def _chain(self, g: Group, rows: list[Sequence]):
        g.busy = False  # its step is home
        if not self._may_chain(g, rows):
            return None
        if (
            self.calls
            or self.to_free
            or g.joining
            or any(s.removed for s in rows)
            or self._oldest_lane() is not g
        ):
            # They go out first. On a pipeline, nothing leaves before this step's payload is read:
            # read now, before the head and sampling are built on it (a wait once they were read
            # sees none).
            self.pipe.make_way()
        return lambda ids: self._chained(g, rows, ids)

    def _chained(self, g: Group, rows: list[Sequence], ids: mx.array) -> None:
        """`g`'s next step on `ids (B, 1)`, sampled for `rows` and not yet read. What goes before it
        goes first, as `_submit_next` would send it (calls, frees, rows leaving or joining, a lane
        that waited longer), so rows that left take no part and rows that joined feed their first
        token; where the ring has no room left for the step, it goes once the tokens are read."""
        while self.pipe.can_submit():
            if self._submit_queued() or self._submit_rows_change(g):
                continue
            lane = self._oldest_lane()
            if lane is g or lane is False:
                break
            self._submit_lane(lane)
        if not (g.rows and self.pipe.can_submit(chained=True) and self._oldest_lane() is g):
            return
        if any(h.group == g.id and h.kind in TOUCH for h, _, _ in self.calls):
            # a save or trim of its rows that found no room reads their caches as they stand: the
            # step goes once it has
            return
        at = {id(s): i for i, s in enumerate(rows)}
        kept = [at[id(s)] for s in g.rows if id(s) in at]
        if kept != list(range(len(rows))):
            # every row may have left (kept empty), and MLX makes an empty list float32
            ids = ids[mx.array(kept, dtype=mx.int32)]
        if len(kept) < len(g.rows):  # sampled ids may be uint32; the ring carries int32
            joined = [[s.last] for s in g.rows[len(kept) :]]
            ids = mx.concatenate([ids.astype(mx.int32), mx.array(joined, dtype=mx.int32)])
        self._submit_decode_of(g, ids, chained=True)

    def postprocess(self, step: Step, ran: Ran) -> list[tuple[Sequence, Token | Exception]]:
        """The step's tokens into their sequences (a failed row leaves before the next step); a
        prefill batch saved in the prompt cache and on to its group; rejected drafts dropped."""
        if step.kind == Kind.PREFILL:
            b = step.prefill
            for s, t in ran.tokens:
                # a failed row leaves before the next step
                s.last = t.id if isinstance(t, Token) else 0
                s.prefilled = True
            if self.prefix:
                self._save(
                    Kind.SAVE,
                    b.id,
                    [(row, s.prompt, s.saved) for row, s in enumerate(b.rows) if not s.removed],
                )
            group = self._release(b)
            assert group is not None, (
                "every prefill batch is formed for a group (batching._next_batch)"
            )
            group.joining.append(b)
        elif ran.drops is not None:
            self._verified(step, ran)
        else:
            for seq, token in ran.tokens:
                # a failed row leaves before the next step
                seq.last = token.id if isinstance(token, Token) else 0
        return [(s, t) for s, t in ran.tokens if not s.removed]

    def _verified(self, step: Step, ran: Ran) -> None:
        # Every rank then drops the positions rows did not keep: with the group's next
        # step when every row drops the same, else by a TRIM step queued before anything
        # else touches the group.
        g, drops = step.group, ran.drops
        self.drafted, self.accepted = (
            self.drafted + sum(map(len, step.drafts)),
            self.accepted + ran.accepted,
        )
        if len(set(drops)) == 1:
            # the same for every row (always, alone): folded into the group's next step
            g.drop = drops[0]
        else:
            self.calls.append((*self._trim(g, drops), lambda _: None))
        g.busy = g.verifying = False
        for s in g.saves:  # rows that left while the step was out: saved as trimmed
            self._save_row(g, s)
        g.saves.clear()
