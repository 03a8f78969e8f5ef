"""Tensor mode on real rings: every rank holds a share of every layer, and the ring computes what
single-process mlx-lm computes (the same greedy tokens), batched, with the prompt cache and with
speculative decoding."""

import json

import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, load_tokenizer
from probeutil import alone, read_probe, run_probe
from ringutil import make_tiny_model, reference_logits

TEXT = (
    "The lighthouse keeper climbed the stairs each evening, lit the lamp, and watched the ships "
    "pass through the narrow channel between the rocks."
)


def chat(tokenizer, content):
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True
    )


def share_bytes(model_path, n: int) -> int:
    """The bytes a tensor rank holds: a 1/n share of every projection, the rest
    (embedding, head, norms) whole."""
    model, _ = load_model(model_path)
    return sum(
        v.nbytes // (n if name.endswith("proj.weight") else 1)
        for name, v in tree_flatten(model.parameters())
    )


def test_tensor3_default_model_greedy_tokens_identical_to_mlx_lm(tmp_path, default_model):
    """SmolLM2 (9 heads, 3 KV heads) on 3 ranks: two prompts prefilled and decoded together, one
    joining mid-flight, drafts by prompt lookup, and a chat's next turn from the prompt cache."""
    tokenizer = load_tokenizer(default_model)
    copy = chat(tokenizer, f"Repeat this text exactly, word for word:\n\n{TEXT}")
    spec = [
        {"prompt": copy, "max_tokens": 20, "at": 0},
        {"prompt": chat(tokenizer, "Write a short poem about the sea."), "max_tokens": 8, "at": 0},
        {"prompt": chat(tokenizer, "Name three colours."), "max_tokens": 8, "at": 3},
        {
            "prompt": chat(tokenizer, "And again, please.")[1:],
            "max_tokens": 8,
            "follow": 0,
            "after": 0,
        },
    ]
    tokens, _, status, ranks = run_probe(
        tmp_path, 3, default_model, spec, draft=4, prompt_cache=4096, parallel="tensor"
    )
    result = json.loads((tmp_path / "result.json").read_text())
    for i, s in enumerate(result["prompts"]):
        want = alone(default_model, s, spec[i]["max_tokens"])
        assert tokens[i] == want, (
            f"sequence {i}: {tokenizer.decode(tokens[i])!r} != {tokenizer.decode(want)!r}"
        )
    assert 2 in result["prefill_rows"] and max(result["decode_rows"]) >= 2, result  # batched
    assert result["accepted"] > 0, result  # the copy is guessed from the prompt
    # the next turn started from the first
    assert result["prompt_cache"]["hit_tokens"] > len(copy), result
    # freed on every rank
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)
    # every rank's row, joined by the status step's all_sum
    assert [r["rank"] for r in status] == [0, 1, 2]
    held = share_bytes(default_model, 3)
    assert [(tuple(r["layers"]), r["parameter_bytes"]) for r in ranks] == [((0, 30), held)] * 3


LONE = [5, 17, 42, 99, 3, 250, 7]
BATCH = [
    {"prompt": LONE, "max_tokens": 6, "at": 0},
    {"prompt": [8, 1, 77, 31, 200], "max_tokens": 6, "after": 0},
    {"prompt": [64, 9, 13, 2, 2, 150, 300, 11, 4], "max_tokens": 6, "after": 0},
    {"prompt": [19, 23], "max_tokens": 5, "follow": 2, "after": 2},
]
DRAFTED = [
    {"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 12, "at": 0},
    {"prompt": [8, 1, 77, 31, 200], "max_tokens": 8, "at": 2},
]
KINDS = ["llama", "qwen3"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """The 2-rank tiny runs below, one after another in one launch (startup is most of a run this
    short): {name: (its output folder, its model)}."""
    tmp = tmp_path_factory.mktemp("two")
    models = {kind: make_tiny_model(tmp / kind, kind) for kind in KINDS}
    runs = {kind: (models[kind], {"spec": BATCH, "prompt_cache": 4096}) for kind in KINDS}
    # Drafts from a model on rank 0 (here the target itself, so most are kept),
    # verified on both ranks.
    runs["draft"] = (
        models["llama"],
        {"spec": DRAFTED, "draft": 3, "draft_model": str(models["llama"])},
    )
    outs = {name: tmp / f"out-{name}" for name in runs}
    for o in outs.values():
        o.mkdir()
    run_probe(
        tmp,
        2,
        [m for m, _ in runs.values()],
        BATCH,
        outs=list(outs.values()),
        parallel="tensor",
        chunk=32,
        cases=[case for _, case in runs.values()],
        timeout=300 * 2,
    )
    return {name: (outs[name], model) for name, (model, _) in runs.items()}


def test_tensor2_tiny_models_match_single_process(two_ranks):
    """Random llama and qwen3 models (4 heads, 2 KV heads) on 2 ranks: a lone prompt's logits
    within 1e-4 of mlx-lm's (each rank sums its heads' and columns' share, then the all_sum
    adds the shares: float32 sums in another order), then prompts batched and a next turn
    from the prompt cache."""
    for kind in KINDS:
        out, model = two_ranks[kind]
        tokens, logits, status, ranks = read_probe(out, 2, BATCH)
        result = json.loads((out / "result.json").read_text())
        want, want_tokens = reference_logits(model, LONE, steps=6)
        np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4, err_msg=kind)
        assert tokens[0] == want_tokens, kind
        for i, s in enumerate(result["prompts"][1:], 1):
            assert tokens[i] == alone(model, s, BATCH[i]["max_tokens"]), (kind, i)
        assert 2 in result["prefill_rows"], (kind, result)
        assert result["prompt_cache"]["hit_tokens"] > 0, (kind, result)
        assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status), kind
        assert [r["parameter_bytes"] for r in ranks] == [share_bytes(model, 2)] * 2, kind


def test_tensor2_draft_model_keeps_greedy_output_exact(two_ranks):
    """Drafts from a model on rank 0 (here the target itself, so most are kept),
    verified on both ranks."""
    out, model = two_ranks["draft"]
    tokens, _, status, _ = read_probe(out, 2, DRAFTED)
    result = json.loads((out / "result.json").read_text())
    for i, s in enumerate(DRAFTED):
        assert tokens[i] == alone(model, s["prompt"], s["max_tokens"]), i
    assert result["accepted"] >= 0.8 * result["drafted"] > 0, result
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)


def test_tensor3_ranks_keep_a_shared_kv_head_and_match_single_process(tmp_path):
    """A random qwen3 (4 heads over 2 KV heads, q/k norms per head) on 3 ranks, more ranks
    than KV heads: query heads 2 + 1 + 1, ranks 1 and 2 each keeping KV head 1 and its
    cache. In one launch: a lone prompt's logits within 1e-4 of mlx-lm's, then prompts
    batched and a next turn from the prompt cache; then drafts by prompt lookup; greedy
    tokens exact, every rank's caches freed."""
    model = make_tiny_model(tmp_path / "qwen3", "qwen3")
    outs = [tmp_path / "batch", tmp_path / "drafts"]
    for o in outs:
        o.mkdir()
    run_probe(
        tmp_path,
        3,
        [model, model],
        BATCH,
        outs=outs,
        parallel="tensor",
        chunk=32,
        timeout=300 * 2,
        cases=[{"spec": BATCH, "prompt_cache": 4096}, {"spec": DRAFTED, "draft": 3}],
    )
    tokens, logits, status, _ = read_probe(outs[0], 3, BATCH)
    result = json.loads((outs[0] / "result.json").read_text())
    want, want_tokens = reference_logits(model, LONE, steps=6)
    np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4)
    assert tokens[0] == want_tokens
    for i, s in enumerate(result["prompts"][1:], 1):
        assert tokens[i] == alone(model, s, BATCH[i]["max_tokens"]), i
    assert 2 in result["prefill_rows"] and result["prompt_cache"]["hit_tokens"] > 0, result
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)
    tokens, _, status, _ = read_probe(outs[1], 3, DRAFTED)
    for i, s in enumerate(DRAFTED):
        assert tokens[i] == alone(model, s["prompt"], s["max_tokens"]), i
    assert json.loads((outs[1] / "result.json").read_text())["drafted"] > 0
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)
