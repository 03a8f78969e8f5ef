"""The core promise: the ring computes exactly what single-process mlx-lm computes."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, load_tokenizer

from ringutil import ROOT, launch, make_tiny_model

PROBE = str(ROOT / "tests" / "ring_probe.py")


def run_probe(tmp_path, n, model, prompt, steps, layers=None):
    argv = [PROBE, "--model", str(model), "--prompt", ",".join(map(str, prompt)), "--steps", str(steps), "--out", str(tmp_path)]
    launch(n, tmp_path, argv + (["--layers", layers] if layers else []))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    out = json.loads((tmp_path / "tokens.json").read_text())
    return np.load(tmp_path / "logits.npy"), out["tokens"], out["status"], ranks


def reference_logits(model_path, prompt, steps):
    """Single-process mlx_lm: the whole model, its own cache, greedy steps."""
    model, _ = load_model(model_path)
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [], []
    for _ in range(steps):
        rows.append(np.array(logits.astype(mx.float32)))
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([[tokens[-1]]]), cache=cache)[0, -1]
    return np.stack(rows), tokens


@pytest.mark.parametrize("kind,n,layers", [
    ("llama", 3, None),       # 7 layers as 3,2,2
    ("qwen2", 3, "1,4,2"),    # tied embeddings, biases, custom uneven split
    ("qwen3", 3, "3,1,3"),    # q/k norms
    ("llama", 2, "6,1"),
])
def test_tiny_models_logits_match_single_process(tmp_path, kind, n, layers):
    model = make_tiny_model(tmp_path / "model", kind)
    prompt = [5, 17, 42, 99, 3, 250, 7]
    got, tokens, status, ranks = run_probe(tmp_path, n, model, prompt, steps=6, layers=layers)
    want, want_tokens = reference_logits(model, prompt, steps=6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # prefill and 5 cached decode steps
    assert tokens == want_tokens
    assert all(r["open_sequences"] == 0 for r in status)  # freed on every rank


@pytest.mark.parametrize("n", [1, 2, 3])
def test_default_model_greedy_tokens_identical_to_mlx_lm(tmp_path, default_model, n):
    tokenizer = load_tokenizer(default_model)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}], add_generation_prompt=True)
    _, tokens, _, ranks = run_probe(tmp_path, n, default_model, prompt, steps=32)
    model, _ = load_model(default_model)
    want = [int(t) for t, _ in zip((tok for tok, _ in generate_step(mx.array(prompt), model, max_tokens=32)), range(32))]
    assert tokens == want, f"{n} ranks: {tokenizer.decode(tokens)!r} != {tokenizer.decode(want)!r}"
    assert [tuple(r["layers"]) for r in ranks] == [tuple(x) for x in _uniform(30, n)]


def _uniform(n_layers, n):
    from plan import uniform_plan

    return uniform_plan(n_layers, n).ranges


def test_each_rank_holds_exactly_its_slice(tmp_path, default_model):
    """Bytes held by each rank equal its layers' tensors (+ embedding, norm and head on rank 0),
    and a worker's resident memory stays far below the whole model's size."""
    _, _, _, ranks = run_probe(tmp_path, 3, default_model, [1, 2, 3], steps=1)
    full, _ = load_model(default_model, lazy=True)
    layer_bytes = [sum(v.nbytes for _, v in tree_flatten(layer.parameters())) for layer in full.model.layers]
    ends = sum(v.nbytes for k, v in tree_flatten(full.parameters()) if not k.startswith("model.layers."))
    total = sum(layer_bytes) + ends
    for r in ranks:
        s, e = r["layers"]
        assert r["parameter_bytes"] == sum(layer_bytes[s:e]) + (ends if r["rank"] == 0 else 0)
        assert r["holds_embedding"] == r["holds_head"] == (r["rank"] == 0)
    worker = ranks[1]
    assert worker["rss_kib"] * 1024 < worker["parameter_bytes"] + 0.5 * total, "a worker read more than its slice"
