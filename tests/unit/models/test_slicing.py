"""The slicing mechanism in one process: cuts of a model chained (embed, each rank's body, head)
give the whole model's logits, and a cut after the first holds nothing but its own layers."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from model_zoo import make
from ringutil import TINY, make_tiny_model, reference_logits

from mlx_ring.models.slicing import Slice

PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 9]  # longer than the tiny sliding windows (5)


def cuts(path, sizes: list[int]) -> list[Slice]:
    bounds = np.cumsum([0] + sizes).tolist()
    out = []
    for r in range(len(sizes)):
        model, _ = load_model(path, lazy=True)
        out.append(Slice(model, bounds[r], bounds[r + 1], ends=r == 0))
        mx.eval(model.parameters())
    return out


# the families whose forwards differ most (every type: the model matrix)
@pytest.mark.parametrize("kind", list(TINY))
@pytest.mark.parametrize("sizes", [[2, 3, 2], [6, 1], [1, 1, 5]])
def test_chained_cuts_equal_the_whole_model(tmp_path, kind, sizes):
    check_chained_cuts(make_tiny_model(tmp_path / kind, kind), sizes)


# What each needs of the slicing, beyond a layer list: learned positions read from the caches before
# the first layer (GPT-2); state carried to every layer beside the hidden states (Talkie's token
# embeddings, RWKV-7's first layer's values); a cache offset read for layers of another kind
# (Bailing's linear layers); masks from caches of lists told apart by their parts (Baichuan-M1); a
# cache of the code before the layers (LongCat's n-grams).
@pytest.mark.parametrize(
    "kind", ["gpt2", "talkie", "rwkv7", "bailing_moe_linear", "baichuan_m1", "longcat_flash_ngram"]
)
@pytest.mark.parametrize("sizes", [[1, 2, 1], [3, 1]])
def test_chained_cuts_of_models_that_need_more_than_a_layer_list(tmp_path, kind, sizes):
    check_chained_cuts(make(kind, tmp_path / kind), sizes)


def test_only_models_whose_layers_take_state_made_before_them_carry_it(tmp_path):
    kinds = ["llama", "gemma3_text", "talkie", "rwkv7"]
    carried = {kind: cuts(make(kind, tmp_path / kind), [4])[0].carry for kind in kinds}
    assert carried["llama"] is None and carried["gemma3_text"] is None
    assert (carried["talkie"].hidden, carried["talkie"].names) == ("x", ["e_x"])
    rwkv = carried["rwkv7"]
    assert (rwkv.hidden, rwkv.names, rwkv.returned) == ("x", ["v_first"], ["v_first"])


def check_chained_cuts(path, sizes: list[int]) -> None:
    want, want_tokens = reference_logits(path, PROMPT, steps=4)
    ring = cuts(path, sizes)
    caches = [c.new_caches() for c in ring]

    def step(tokens: list[int]) -> mx.array:
        h = ring[0].embed(mx.array([tokens]))
        for c, kv in zip(ring, caches):
            h = c.forward(h, kv)
        return ring[0].head(h)[0, -1]

    logits, got = step(PROMPT), []
    for _ in range(4):
        got.append(np.array(logits.astype(mx.float32)))
        logits = step([int(mx.argmax(logits).item())])
    # the same operations in the same order: bitwise
    np.testing.assert_array_equal(np.stack(got), want)
    for r, c in enumerate(ring):
        names = [k for k, _ in tree_flatten(c.model.parameters())]
        # the layer list: `layers`, `h` (GPT-2), `blocks`, ...
        inside = [k for k in names if f".{c.key}." in k]
        assert r == 0 or names == inside, f"rank {r} holds {set(names) - set(inside)}"
        held = {int(k.split(f".{c.key}.")[1].split(".")[0]) for k in inside}
        assert held == set(range(c.start, c.end)), f"rank {r} holds layers {held}"


def test_a_cut_keeps_the_cache_kinds_of_its_layers(tmp_path):
    """Gemma 3 (every third layer global, the rest sliding): a cut's caches are those of its layers,
    and a mask taken from a layer another rank holds comes from a local cache of the same kind."""
    path = make_tiny_model(tmp_path / "g", "gemma3_text")
    c = cuts(path, [4, 3])[1]  # layers 4, 5, 6: sliding, global (5), sliding
    assert [type(k).__name__ for k in c.new_caches()] == [
        "RotatingKVCache",
        "KVCache",
        "RotatingKVCache",
    ]
    assert c.alias[2] == 1 and c.alias[0] == 0 and c.alias[4:] == [0, 1, 2]
