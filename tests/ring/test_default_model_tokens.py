"""The default model on the ring gives single-process mlx-lm's greedy tokens: on 1, 2 and 3 ranks,
each holding exactly its slice of the weights, and with big prefill chunks beside decode groups
on 2 ranks, which must neither deadlock nor change a token."""

import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, load_tokenizer
from probeutil import alone, run_probe


@pytest.mark.parametrize("n", [1, 2, 3])
def test_default_model_greedy_tokens_identical_to_mlx_lm(tmp_path, default_model, n):
    """The same greedy tokens, and each rank holds exactly its slice of the weights."""
    tokenizer = load_tokenizer(default_model)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea."}],
        add_generation_prompt=True,
    )
    tokens, _, _, ranks = run_probe(
        tmp_path, n, default_model, [{"prompt": prompt, "max_tokens": 32, "at": 0}]
    )
    want = alone(default_model, prompt, 32)
    assert tokens[0] == want, (
        f"{n} ranks: {tokenizer.decode(tokens)!r} != {tokenizer.decode(want)!r}"
    )
    assert [tuple(r["layers"]) for r in ranks] == [tuple(x) for x in _uniform(30, n)]
    each_rank_holds_exactly_its_slice(default_model, ranks)


def _uniform(n_layers, n):
    from mlx_ring.planning.plan import uniform_plan

    return uniform_plan(n_layers, n).ranges


def each_rank_holds_exactly_its_slice(default_model, ranks):
    """Bytes held by each rank equal its layers' tensors (+ embedding, norm and head on rank 0),
    and a worker's resident memory stays far below the whole model's size."""
    full, _ = load_model(default_model, lazy=True)
    layer_bytes = [
        sum(v.nbytes for _, v in tree_flatten(layer.parameters())) for layer in full.model.layers
    ]
    ends = sum(
        v.nbytes for k, v in tree_flatten(full.parameters()) if not k.startswith("model.layers.")
    )
    total = sum(layer_bytes) + ends
    for r in ranks:
        s, e = r["layers"]
        assert r["parameter_bytes"] == sum(layer_bytes[s:e]) + (ends if r["rank"] == 0 else 0)
        assert r["holds_embedding"] == r["holds_head"] == (r["rank"] == 0)
    for worker in ranks[1:]:
        assert worker["rss_kib"] * 1024 < worker["parameter_bytes"] + 0.5 * total, (
            "a worker read more than its slice"
        )


def test_default_model_batched_and_long_prompt_cannot_hang(tmp_path, default_model):
    """Big prefill chunks (1.2 MB of hidden states each) overlapping decode groups on 2
    ranks: the ring must neither deadlock on send/recv ordering (the launch has a
    timeout) nor change tokens."""
    tokenizer = load_tokenizer(default_model)

    def chat(q):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True
        )

    long_prompt = chat("Summarise: " + "the sea is wide and the sky is blue; " * 120)
    spec = [
        {"prompt": chat("What is the capital of France?"), "max_tokens": 16, "at": 0},
        {"prompt": long_prompt, "max_tokens": 4, "at": 1},
        {"prompt": chat("Name three colours."), "max_tokens": 16, "at": 2},
    ]
    tokens, _, status, _ = run_probe(
        tmp_path, 2, default_model, spec, groups=2, chunk=512, timeout=240
    )
    for i, s in enumerate(spec):
        assert tokens[i] == alone(default_model, s["prompt"], s["max_tokens"]), f"sequence {i}"
    assert all(r["open_sequences"] == 0 for r in status)
