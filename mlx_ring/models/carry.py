"""State a model's layers take beside the hidden states, made before the first layer or by an
earlier layer (Talkie's normalized token embeddings, RWKV-7's first layer's values): a rank
after the first cannot make it, so it crosses ranks with the hidden states, packed after them
on the last axis.

Which arguments those are, a dry run of the model's whole forward says (lazy: graphs are built,
nothing is computed): the arguments of its second layer, other than the hidden states, that are
arrays of one row per token. Most models have none, and run as before.
"""

import inspect
import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from mlx_ring.models.standins import Handoff, Relay, StandIn, _passed_on

# The dry run's batch and length: different, so an array shaped (B, L, ...) is told from a mask.
B, L = 2, 3


@dataclass
class Carry:
    """How a layer's call takes what crosses ranks beside the hidden states."""

    sig: inspect.Signature  # a layer's call
    hidden: str  # the argument that takes the hidden states
    names: list[str]  # the arguments carried beside them
    shapes: list[tuple]  # their shapes past (B, L)
    width: int  # the hidden size
    returned: list[str]  # the arguments a layer returns again after the hidden states

    def pack(self, h: mx.array, values: dict) -> mx.array:
        b, n = h.shape[:2]
        return mx.concatenate(
            [h, *(values[k].reshape(b, n, -1).astype(h.dtype) for k in self.names)], axis=-1
        )

    def unpack(self, packed: mx.array) -> tuple[mx.array, dict]:
        b, n = packed.shape[:2]
        at, out = self.width, {}
        for k, shape in zip(self.names, self.shapes):
            size = math.prod(shape)
            out[k] = packed[..., at : at + size].reshape(b, n, *shape)
            at += size
        return packed[..., : self.width], out


def find_carry(model: nn.Module, owner: nn.Module, key: str) -> Carry | None:
    """What the model's layers take that must cross ranks, or None (most models)."""
    layers = owner[key]
    if len(layers) < 2:
        return None
    sig = inspect.signature(layers[1])
    required = [
        p
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if len(required) < 2:  # the hidden states and nothing else a layer must be given
        return None
    seen: list = []
    try:
        owner[key] = [_Watch(layer, seen) for layer in layers]
        model(mx.zeros((B, L), mx.int32))
        passed = _passed_on(layers[1])
    except Exception:  # noqa: BLE001 -- a forward that cannot run without caches, say: nothing found
        return None
    finally:
        owner[key] = layers
    (args, _), (_, out) = seen[1], seen[0]
    prev = out[0] if isinstance(out, tuple) else out
    hidden = next((k for k, v in args.items() if v is prev), None)
    names = [
        k
        for k, v in args.items()
        if k != hidden and isinstance(v, mx.array) and v.shape[:2] == (B, L)
    ]
    if hidden is None or not names or prev.shape[:2] != (B, L) or prev.ndim != 3:
        return None
    return Carry(
        sig,
        hidden,
        names,
        [args[k].shape[2:] for k in names],
        prev.shape[-1],
        passed[1] if passed else [],
    )


class _Watch(StandIn):
    """A layer in the dry run: runs it (lazily), noting the arguments it got
    and what it returned."""

    def __init__(self, layer: nn.Module, seen: list):
        super().__init__(layer)
        self.layer, self._seen = layer, seen

    def __call__(self, *args, **kwargs):
        bound = inspect.signature(self.layer).bind(*args, **kwargs)
        bound.apply_defaults()
        out = self.layer(*args, **kwargs)
        self._seen.append((dict(bound.arguments), out))
        return out


class Carrying(StandIn):
    """A local layer of a model that carries state: the first (`entry`, on a rank after the first)
    takes the hidden states and the carried values that arrived; every one takes the carried values
    in place of the ones the forward made from its stand-in input; the last (`exit`) hands out its
    output, with the carried values packed after it where another rank follows (`pack`)."""

    def __init__(
        self, layer: nn.Module, relay: Relay, carry: Carry, entry: bool, exit: bool, pack: bool
    ):
        super().__init__(layer)
        self.layer, self._relay, self._carry = layer, relay, carry
        self._entry, self._exit, self._pack = entry, exit, pack

    def __call__(self, *args, **kwargs):
        c, relay = self._carry, self._relay
        bound = c.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if self._entry:
            a[c.hidden] = relay.h
            # what the forward made, the same for each layer
            relay.stale = {k: a[k] for k in c.names}
        if relay.fresh is not None:
            for k in c.names:
                if a[k] is relay.stale[k]:
                    a[k] = relay.fresh[k]
        out = self.layer(*bound.args, **bound.kwargs)
        if not self._exit:
            return out
        h = out[0] if isinstance(out, tuple) else out
        if self._pack:
            values = {**a, **(dict(zip(c.returned, out[1:])) if isinstance(out, tuple) else {})}
            h = c.pack(h, values)
        raise Handoff(h)
