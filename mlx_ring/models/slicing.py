"""A rank's cut of a model, run through the model's own forward (mlx-lm's code), so masks, scales,
soft-capping and cache kinds are the model's, not a copy of ours.

The model's layer list keeps its full length, so whatever a forward reads by layer index (which
layers slide, which cache a mask comes from) stays right; the layers other ranks hold are stand-ins
that pass hidden states through. Three passes use it:
- embed (rank 0, for callers that want hidden states): the forward up to its first
  layer, on token ids;
- body (every rank): the forward whose first local layer takes the hidden states that arrived (a
  slice from layer 0: the forward from the token ids, as alone), and whose last local layer hands
  its output back (an exception ends the forward there);
- head (rank 0): the forward whose last layer hands in the hidden states back from the ring, so the
  final norm, the head and any logit scaling run as the model runs them.
"""

import copy
import weakref
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import BatchKVCache, CacheList, make_prompt_cache

from mlx_ring.models.carry import Carrying, find_carry
from mlx_ring.models.compat import plain_kv_caches
from mlx_ring.models.standins import (
    Absent,
    Entry,
    Exit,
    Handoff,
    Inject,
    Relay,
    StandIn,
    Stop,
    _split,
)


class FreshBatch:
    """A prefill batch of right-padded prompts' cache (new, or loaded from the prompt cache at one
    length for all rows): no row has left padding, and padding only follows a row's tokens, so the
    plain causal mask is exact. The batch cache's own mask is an array, and on CUDA a masked
    attention kernel is built for each new batch shape."""

    def __init__(self, cache):
        self._cache = cache

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        if return_array or (window_size and N > window_size):
            return self._cache.make_mask(N, return_array=return_array, window_size=window_size)
        return "causal"


class LoneRowMask:
    """A decode group's batch cache's `make_mask`, set on the cache itself when the group forms
    (`lone_row_masks`): for a step of one position while the group has one row, no mask. That
    row has no left padding (a lone prompt joins with none, and `filter` and `trim_rows` leave
    a lone row with none), so every key it holds is attended, as in mlx-lm's own single-stream
    loop. The batch cache's mask is an array, which keeps CUDA off its fused one-query
    attention kernel and costs a mask conversion a layer. On the cache, not a wrapper made each
    step: no Python a layer a step. It holds the cache weakly, so the group's caches are freed
    as soon as the group goes."""

    __slots__ = ("_cache",)

    def __init__(self, cache: BatchKVCache):
        self._cache = weakref.ref(cache)

    def __call__(self, N: int, return_array: bool = False, **kwargs):
        cache = self._cache()
        if N == 1 and not return_array and cache.offset.shape[0] == 1:
            return None
        return BatchKVCache.make_mask(cache, N, return_array=return_array, **kwargs)


def lone_row_masks(caches: list) -> None:
    """Give a decode group's plain batch caches the mask of `LoneRowMask` (once; it checks the rows
    at each step, so rows joining or leaving later change nothing)."""
    for c in caches:
        if type(c) is BatchKVCache and not isinstance(vars(c).get("make_mask"), LoneRowMask):
            c.make_mask = LoneRowMask(c)


def layer_list(model: nn.Module) -> tuple[nn.Module, str]:
    """The module whose layer list the forward loops over (`model.model`, or deeper, as in Gemma 3's
    `language_model.model`), and that list's name (`layers`, or `h` in GPT-2-shaped models)."""
    layers = model.layers
    first = layers[0]
    for _, m in model.named_modules():
        for key, v in m.items():
            if isinstance(v, list) and len(v) == len(layers) and v and v[0] is first:
                return m, key
    raise ValueError(
        f"cannot find the layer list of {type(model).__module__}; this model type cannot be split"
    )


def layer_owner(model: nn.Module) -> nn.Module:
    """The module that holds the model's layer list (see `layer_list`)."""
    return layer_list(model)[0]


def _drop_all_but_layers(model: nn.Module, owner: nn.Module, key: str, embed) -> None:
    """Remove every weight outside the owner's layer list (modules without weights, such as a
    shared rotary embedding, stay: the forward may use them before its layers); token or position
    embeddings on the way to it, whatever the model names them, become `embed`."""
    path = (
        next(name for name, m in model.named_modules() if m is owner).split(".")
        if owner is not model
        else []
    )
    module = model
    for part in path + [key]:
        for name, child in list(module.items()):
            weights = tree_flatten(child.parameters() if isinstance(child, nn.Module) else child)
            if name != part and any(isinstance(w, mx.array) for _, w in weights):
                module.pop(name)
                if _is_embedding(child):
                    setattr(module, name, embed)
                elif isinstance(child, nn.Module):  # a forward may look it up before its layers run
                    setattr(module, name, Elsewhere(name, embed))
        module = module[part]


def _is_embedding(m) -> bool:
    """An embedding, or a module of nothing but embeddings (Phixtral's `embd`)."""
    kinds = (nn.Embedding, nn.QuantizedEmbedding)
    if not isinstance(m, nn.Module):
        return False
    leaves = [
        v for _, v in tree_flatten(m.leaf_modules(), is_leaf=lambda x: isinstance(x, nn.Module))
    ]
    return isinstance(m, kinds) or (bool(leaves) and all(isinstance(v, kinds) for v in leaves))


class Elsewhere:
    """In place of a module only rank 0 holds. The forward calls it before its first layer only on
    token ids (an embedding with more to it than a table: LongCat's n-grams), and gets `embed`'s
    stand-in hidden states; anything else would be a part of the model this rank cannot run."""

    def __init__(self, name: str, embed):
        self.name, self._embed = name, embed

    def __call__(self, x=None, *args, **kwargs):
        if isinstance(x, mx.array) and mx.issubdtype(x.dtype, mx.integer):
            return self._embed(x)
        raise AssertionError(f"{self.name} runs on rank 0 only")


def share_offsets(caches: list) -> None:
    """Let a decode group's plain batch caches hold one offset array: each layer's cache adds
    the step's length to its own (equal) offsets, one small device op a layer every step, and
    each next step's rotary embedding reads them. Shared, the other layers' additions are
    never computed. Exact: every layer's cache of a group goes through the same steps, so
    their offsets are equal."""
    first = next((c for c in caches if type(c) is BatchKVCache), None)
    if first is None:
        return
    for c in caches:
        if type(c) is BatchKVCache and c._idx == first._idx:
            c.offset = first.offset


def cache_kind(cache) -> tuple:
    """Caches of one kind hold the same positions for the same tokens, so give the same masks (a
    `CacheList` by its parts: Baichuan-M1's hold a sliding window or not)."""
    parts = tuple(cache_kind(c) for c in cache.caches) if isinstance(cache, CacheList) else None
    return (
        type(cache).__name__,
        getattr(cache, "max_size", None),
        getattr(cache, "keep", None),
        parts,
    )


def _positional(cache) -> list:
    """The parts of a cache that count positions (a `CacheList`'s, or the cache itself)."""
    parts = cache.caches if isinstance(cache, CacheList) else (cache,)
    return [p for p in parts if hasattr(p, "offset")]


class _Probe:
    """A cache in a dry run of the forward: the real (empty) one, marked with its
    place in the list."""

    def __init__(self, j: int, cache):
        self.j, self._cache = j, cache

    def __getattr__(self, name):
        return getattr(self._cache, name)

    # a cache of arrays, read by the code before the layers (n-gram embeddings)
    def __getitem__(self, i):
        return self._cache[i]

    def __setitem__(self, i, value):  # the dry run leaves the real (empty) cache as it is
        pass


class _Recorder(StandIn):
    """A layer in a dry run of the forward: notes which cache it is given, computes nothing."""

    def __init__(self, layer: nn.Module, i: int, seen: dict):
        super().__init__(layer)
        self._i, self._seen = i, seen

    def __call__(self, *args, **kwargs):
        for v in [*args, *kwargs.values()]:
            if isinstance(v, _Probe):
                self._seen.setdefault(v.j, self._i)
        h, args, kwargs = _split(args, kwargs)
        return self._out(h, args, kwargs)


def _cache_owners(model: nn.Module, owner: nn.Module, key: str, protos: list) -> list[int]:
    """The layer each of `protos` is given to, from a dry run of the model's forward (lazy:
    nothing is computed or read) with recording stand-ins for its layers; -1 for one no layer is
    given: the code before the layers keeps it (LongCat's n-gram embeddings, their last token
    ids), on rank 0."""
    layers, seen = owner[key], {}
    owner[key] = [_Recorder(layer, i, seen) for i, layer in enumerate(layers)]
    try:
        model(mx.zeros((1, 1), mx.int32), cache=[_Probe(j, c) for j, c in enumerate(protos)])
    finally:
        owner[key] = layers
    if len(set(seen.values())) != len(seen):
        raise ValueError(
            f"{type(model).__module__} keeps {len(protos)} caches for {len(layers)} layers, some "
            "layer takes several: this model type cannot be split"
        )
    return [seen.get(j, -1) for j in range(len(protos))]


class Slice:
    """Layers `[start, end)` of a model, its embedding and head where `ends` (rank 0)."""

    def __init__(self, model: nn.Module, start: int, end: int, ends: bool):
        self.model, self.start, self.end = model, start, end
        self.owner, self.key = layer_list(model)
        layers = self.owner[self.key]
        n = len(layers)
        # before the cut: a model's make_cache may read its layers
        protos = make_prompt_cache(model)
        # before the cut: a dry run of the whole forward
        self.carry = find_carry(model, self.owner, self.key)
        # The layer each cache is for: cache i is layer i's, unless some layers keep
        # none (Nemotron-H's feed-forward layers), where a dry run of the forward says
        # which layer takes which.
        owners = (
            list(range(n))
            if len(protos) == n
            else _cache_owners(model, self.owner, self.key, protos)
        )
        # every layer's (not only this slice's), so every rank agrees
        self.plain_kv = plain_kv_caches(protos)
        mine = [j for j, i in enumerate(owners) if start <= i < end or (i < 0 and start == 0)]
        if not mine and protos:
            raise ValueError(
                f"layers [{start}, {end}) of {type(model).__module__} keep no cache; give this "
                "rank other layers (LAYERS=)"
            )
        self.protos = [protos[j] for j in mine]  # fresh, empty: copied for each new prompt
        kinds = [cache_kind(c) for c in protos]
        # Where a forward takes a mask from another layer's cache, a local cache of the same kind
        # has the same positions. A positional kind this slice lacks gets a counter of its own (see
        # `_count`): a forward may read its offset for every layer (Bailing's linear layers' RoPE).
        local = {}
        for k, j in enumerate(mine):
            local.setdefault(kinds[j], k)
        self.counters = []
        for j, c in enumerate(protos):
            if kinds[j] not in local and _positional(c):
                local[kinds[j]] = len(self.protos)
                self.counters.append(len(self.protos))
                self.protos.append(c)
        self.alias = [
            mine.index(j) if j in mine else local.get(kinds[j]) for j in range(len(protos))
        ]
        self.relay = Relay()
        body = [Absent(layer) for layer in layers]
        for i in range(start, end):
            body[i] = layers[i]
        body[start] = Entry(body[start], self.relay)
        body[end - 1] = Exit(body[end - 1])
        if self.carry:
            for i in range(start, end):
                body[i] = Carrying(
                    layers[i],
                    self.relay,
                    self.carry,
                    entry=i == start > 0,
                    exit=i == end - 1,
                    pack=end < n,
                )
        self.body = body
        self.embed_view = [Stop(layers[0])] + body[1:]
        # Rank 0 runs the forward from the token ids, with its caches: what the forward computes
        # before its first layer from the caches (learned position embeddings) is then right.
        self.from_tokens = list(body)
        if not self.carry:
            self.from_tokens[start] = Exit(layers[start]) if end - start == 1 else layers[start]
        self._embedded: tuple | None = None  # (hidden states, the token ids they came from)
        self.head_view = [Absent(layer) for layer in layers[:-1]] + [Inject(layers[-1], self.relay)]
        self.owner[self.key] = body
        if not ends:  # the embedding, final norm and head live on rank 0 only
            _drop_all_but_layers(model, self.owner, self.key, self.relay.embed_tokens)

    def new_caches(self) -> list:
        """Empty caches for the local layers, of the kinds the model makes for them."""
        return copy.deepcopy(self.protos)

    def embed(self, tokens: mx.array) -> mx.array:
        """Token ids `(B, L)` -> hidden states `(B, L, H)` as the model's forward makes them
        before its first layer (embedding, and scaling where the model scales)."""
        with self._using(self.embed_view):
            h = self._run(tokens, None)
        self._embedded = (h, tokens)
        return h

    def forward(self, h: mx.array, caches: list, fresh_batch: bool = False) -> mx.array:
        """The local layers on hidden states `(B, L, H)`, or, in a slice from the first layer, on
        token ids `(B, L)` (the model's own forward embeds them, as alone), with their caches;
        `fresh_batch`: a prefill batch of right-padded prompts (see `FreshBatch`)."""
        embedded, self._embedded = self._embedded, None
        # from `embed`: run from its ids
        if self.start == 0 and embedded is not None and embedded[0] is h:
            h = embedded[1]
        tokens = self.start == 0 and h.ndim == 2 and mx.issubdtype(h.dtype, mx.integer)
        B, L = h.shape[:2]
        # From token ids, no stand-in takes hidden states that arrived (nor stale ones
        # of an earlier pass).
        self.relay.h, self.relay.fresh = (
            (None, None)
            if tokens
            else self.carry.unpack(h)
            if self.carry and self.start
            else (h, None)
        )
        view = [caches[a] if a is not None else None for a in self.alias]
        if fresh_batch:
            view = [FreshBatch(c) if c is not None else None for c in view]
        if tokens:
            with self._using(self.from_tokens):
                out = self._run(h, view)
        else:
            out = self._run(mx.zeros((B, L), mx.int32), view)
        self._count(caches, B, L, out.dtype)
        return out

    def _count(self, caches: list, B: int, L: int, dtype: mx.Dtype) -> None:
        """Advance the counters by the positions just run: an entry of one zero per
        position keeps each counter's offsets (per row in a batch) as a layer's cache of
        its kind would have them."""
        for k in self.counters:
            for c in _positional(caches[k]):
                c.update_and_fetch(*[mx.zeros((B, 1, L, 1), dtype)] * 2)

    def head(self, h: mx.array) -> mx.array:
        """Hidden states after the last layer `(B, L, H)` -> logits `(B, L, V)`, by
        the model's own tail."""
        self.relay.h = h
        with self._using(self.head_view):
            return self.model(mx.zeros(h.shape[:2], mx.int32))

    def _run(self, tokens: mx.array, caches: list | None) -> mx.array:
        try:
            self.model(tokens, cache=caches)
        except Handoff as done:
            return done.h
        raise AssertionError("the forward ended without reaching the slice's boundary")

    @contextmanager
    def _using(self, view: list):
        self.owner[self.key] = view
        try:
            yield
        finally:
            self.owner[self.key] = self.body
