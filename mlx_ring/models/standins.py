"""The stand-ins a rank's cut puts in a model's layer list (see `mlx_ring.models.slicing`): layers
other ranks hold pass the hidden states through; the first and last local layers take them in and
hand them out; in the embed and head passes, others end the forward or hand in the ring's result."""

import ast
import functools
import inspect
import textwrap

import mlx.core as mx
import mlx.nn as nn


class Handoff(Exception):
    """Leaves a model's forward with the hidden states at a slice's boundary."""

    def __init__(self, h: mx.array):
        self.h = h


class StandIn(nn.Module):
    """In a layer's place in the list. Keeps the layer's plain attributes (`is_attention_layer`,
    `use_sliding`, ...), which a model's loop may read to pick a mask."""

    def __init__(self, layer: nn.Module | None = None):
        super().__init__()
        self._passed = _passed_on(layer)
        for k, v in _plain(layer).items():
            setattr(self, k, v)
        # `layer.self_attn.is_local`, say
        for k, child in layer.items() if layer is not None else []:
            if isinstance(child, nn.Module) and not hasattr(self, k):
                setattr(self, k, Attributes(_plain(child)))

    def _out(self, h, args, kwargs):
        """`h` as the layer would return it: alone, or with what it passes on to the next layer (the
        arguments of the same names it was given: Gemma 4's shared KV, say)."""
        if self._passed is None:
            return h
        sig, names = self._passed
        bound = sig.bind(h, *args, **kwargs)
        bound.apply_defaults()
        return (h, *(bound.arguments[n] for n in names))


def _passed_on(layer) -> tuple | None:
    """For a layer whose forward returns a tuple `(h, a, b, ...)` where a, b, ... are arguments it
    was called with: its signature and those names; None where it returns the hidden states alone.
    ValueError where it returns something else beside them (state made in the layer: another rank's
    layers could not get it)."""
    return None if layer is None else _returned_arguments(type(layer))


# a Slice makes stand-ins of every layer several times: read each class's source once
@functools.cache
def _returned_arguments(cls: type) -> tuple | None:
    try:
        fn = cls.__call__
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    returns = [n.value for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    tuples = [r for r in returns if isinstance(r, ast.Tuple)]
    if not tuples:
        return None
    sig = inspect.signature(fn)
    params = list(sig.parameters)[1:]  # less self
    names = [e.id if isinstance(e, ast.Name) else None for e in tuples[0].elts[1:]]
    if None in names or not set(names) <= set(params):
        raise ValueError(
            f"layers of {cls.__module__} return state beside the hidden states "
            f"({ast.unparse(tuples[0])}) that the next layer takes: it cannot cross ranks"
        )
    return inspect.Signature([p.replace() for p in list(sig.parameters.values())[1:]]), names


class Attributes:
    """A layer's part, as far as a forward reads it before calling the
    layer: its plain attributes."""

    def __init__(self, values: dict):
        vars(self).update(values)


def _plain(m) -> dict:
    """A module's attributes of plain values, its properties among them."""
    if m is None:
        return {}
    out = {
        k: v
        for k, v in vars(m).items()
        if not k.startswith("_")
        and (v is None or isinstance(v, (bool, int, float, str, Attributes)))
    }
    for k in _properties(type(m)):
        try:
            v = getattr(m, k)
        except Exception:  # a property of the weights, say: not a plain attribute
            continue
        if isinstance(v, (bool, int, float, str)):
            out[k] = v
    return out


@functools.cache
def _properties(cls: type) -> list[str]:
    return [
        k
        for k in dir(cls)
        if isinstance(getattr(cls, k, None), property)
        and not k.startswith("_")
        and not hasattr(nn.Module, k)
    ]


def _split(args: tuple, kwargs: dict) -> tuple:
    """(hidden states, the other arguments), whether the forward passes them by
    position or by name."""
    if args:
        return args[0], args[1:], kwargs
    name = next(iter(kwargs))
    return kwargs[name], (), {k: v for k, v in kwargs.items() if k != name}


class Absent(StandIn):
    """A layer another rank holds: passes the hidden states through."""

    def __call__(self, *args, **kwargs):
        # the common case, one call a layer: rank 0's head pass runs every layer's
        if args and self._passed is None:
            return args[0]
        h, args, kwargs = _split(args, kwargs)
        return self._out(h, args, kwargs)


class Entry(StandIn):
    """The first local layer: runs on the hidden states that arrived, not on what the forward
    made of its dummy input before it."""

    def __init__(self, layer: nn.Module, relay: "Relay"):
        super().__init__(layer)
        self.layer, self._relay = layer, relay

    def __call__(self, *args, **kwargs):
        h, args, kwargs = _split(args, kwargs)
        return self.layer(self._relay.h, *args, **kwargs)


class Exit(StandIn):
    """The last local layer: its output leaves the forward (the rest of the model is elsewhere)."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.layer = layer

    def __call__(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        raise Handoff(out[0] if isinstance(out, tuple) else out)


class Stop(StandIn):
    """The first layer in the embed pass: ends it."""

    def __call__(self, *args, **kwargs):
        raise Handoff(_split(args, kwargs)[0])


class Inject(StandIn):
    """The last layer in the head pass: hands in the hidden states back from the ring."""

    def __init__(self, layer: nn.Module, relay: "Relay"):
        super().__init__(layer)
        self._relay = relay

    def __call__(self, *args, **kwargs):
        _, args, kwargs = _split(args, kwargs)
        return self._out(self._relay.h, args, kwargs)


class Relay:
    """The hidden states of the pass under way, for the stand-ins to take."""

    h: mx.array | None = None
    fresh: dict | None = None  # carried values that arrived with `h` (`mlx_ring.models.carry`)
    stale: dict | None = None  # what the forward made in their place

    def embed_tokens(self, tokens: mx.array) -> mx.array:
        # Ranks after the first hold no embedding; the forward's pre-layer code runs on
        # zeros shaped as the ids' embeddings in the arriving hidden states' dtype (masks
        # read them), result unused.
        return mx.zeros((*tokens.shape, self.h.shape[-1]), self.h.dtype)
