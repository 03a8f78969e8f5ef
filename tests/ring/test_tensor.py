"""Tensor mode on real rings: every rank holds a share of every layer, and the ring computes what
single-process mlx-lm computes (the same greedy tokens), batched, with the prompt cache and with
speculative decoding."""

import json

import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, load_tokenizer
from ringutil import make_tiny_model, reference_logits
from test_fidelity import alone, read_probe, run_probe

TEXT = ("The lighthouse keeper climbed the stairs each evening, lit the lamp, and watched the ships pass "
        "through the narrow channel between the rocks.")


def chat(tokenizer, content):
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def share_bytes(model_path, n: int) -> int:
    """The bytes a tensor rank holds: a 1/n share of every projection, the rest (embedding, head, norms) whole."""
    model, _ = load_model(model_path)
    return sum(v.nbytes // (n if name.endswith("proj.weight") else 1) for name, v in tree_flatten(model.parameters()))


def test_tensor3_default_model_greedy_tokens_identical_to_mlx_lm(tmp_path, default_model):
    """SmolLM2 (9 heads, 3 KV heads) on 3 ranks: two prompts prefilled and decoded together, one joining
    mid-flight, drafts by prompt lookup, and a chat's next turn from the prompt cache."""
    tokenizer = load_tokenizer(default_model)
    copy = chat(tokenizer, f"Repeat this text exactly, word for word:\n\n{TEXT}")
    spec = [{"prompt": copy, "max_tokens": 20, "at": 0},
            {"prompt": chat(tokenizer, "Write a short poem about the sea."), "max_tokens": 8, "at": 0},
            {"prompt": chat(tokenizer, "Name three colours."), "max_tokens": 8, "at": 3},
            {"prompt": chat(tokenizer, "And again, please.")[1:], "max_tokens": 8, "follow": 0, "after": 0}]
    tokens, _, status, ranks = run_probe(tmp_path, 3, default_model, spec, draft=4, prompt_cache=4096, parallel="tensor")
    result = json.loads((tmp_path / "result.json").read_text())
    for i, s in enumerate(result["prompts"]):
        want = alone(default_model, s, spec[i]["max_tokens"])
        assert tokens[i] == want, f"sequence {i}: {tokenizer.decode(tokens[i])!r} != {tokenizer.decode(want)!r}"
    assert 2 in result["prefill_rows"] and max(result["decode_rows"]) >= 2, result  # batched
    assert result["accepted"] > 0, result  # the copy is guessed from the prompt
    assert result["prompt_cache"]["hit_tokens"] > len(copy), result  # the next turn started from the first
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)  # freed on every rank
    assert [r["rank"] for r in status] == [0, 1, 2]  # every rank's row, joined by the status step's all_sum
    held = share_bytes(default_model, 3)
    assert [(tuple(r["layers"]), r["parameter_bytes"]) for r in ranks] == [((0, 30), held)] * 3


def test_tensor2_tiny_models_match_single_process(tmp_path):
    """Random llama and qwen3 models (4 heads, 2 KV heads) on 2 ranks: a lone prompt's logits within
    1e-4 of mlx-lm's (each rank sums its heads' and columns' share, then the all_sum adds the shares:
    float32 sums in another order), then prompts batched and a next turn from the prompt cache."""
    kinds = ["llama", "qwen3"]
    models = [make_tiny_model(tmp_path / f"model{i}", kind) for i, kind in enumerate(kinds)]
    outs = [tmp_path / f"out{i}" for i in range(len(kinds))]
    for o in outs:
        o.mkdir()
    lone = [5, 17, 42, 99, 3, 250, 7]
    spec = [{"prompt": lone, "max_tokens": 6, "at": 0},
            {"prompt": [8, 1, 77, 31, 200], "max_tokens": 6, "after": 0},
            {"prompt": [64, 9, 13, 2, 2, 150, 300, 11, 4], "max_tokens": 6, "after": 0},
            {"prompt": [19, 23], "max_tokens": 5, "follow": 2, "after": 2}]
    run_probe(tmp_path, 2, models, spec, outs=outs, prompt_cache=4096, parallel="tensor", chunk=32)
    for kind, model, out in zip(kinds, models, outs):
        tokens, logits, status, ranks = read_probe(out, 2, spec)
        result = json.loads((out / "result.json").read_text())
        want, want_tokens = reference_logits(model, lone, steps=6)
        np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-4, err_msg=kind)
        assert tokens[0] == want_tokens, kind
        for i, s in enumerate(result["prompts"][1:], 1):
            assert tokens[i] == alone(model, s, spec[i]["max_tokens"]), (kind, i)
        assert 2 in result["prefill_rows"], (kind, result)
        assert result["prompt_cache"]["hit_tokens"] > 0, (kind, result)
        assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status), kind
        assert [r["parameter_bytes"] for r in ranks] == [share_bytes(model, 2)] * 2, kind


def test_tensor2_draft_model_keeps_greedy_output_exact(tmp_path):
    """Drafts from a model on rank 0 (here the target itself, so most are kept), verified on both ranks."""
    model = make_tiny_model(tmp_path / "model", "llama")
    spec = [{"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 12, "at": 0},
            {"prompt": [8, 1, 77, 31, 200], "max_tokens": 8, "at": 2}]
    (tmp_path / "run").mkdir()
    tokens, _, status, _ = run_probe(tmp_path / "run", 2, model, spec, draft=3, draft_model=model, parallel="tensor", chunk=32)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    for i, s in enumerate(spec):
        assert tokens[i] == alone(model, s["prompt"], s["max_tokens"]), i
    assert result["accepted"] >= 0.8 * result["drafted"] > 0, result
    assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status)
