"""The core promise: the ring computes exactly what single-process mlx-lm computes. Tiny
models of the families whose forwards differ most, split unevenly on 2 and 3 ranks: their
logits alone, in batches, with 1 or 2 groups in flight, and from the prompt cache, all from
one launch per rank count."""

import json

import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from probeutil import DRIVER, read_probe
from ringutil import launch, make_tiny_model, reference_logits

from mlx_ring.models.compat import plain_kv_caches
from mlx_ring.models.support import UNBATCHED

# The families whose forwards differ most run split unevenly on 2 and 3 ranks at more length than
# the model matrix's (test_model_matrix.py, which admits every type): alone here (logits within
# 1e-5), and in a batch with other sequences (BATCHED, below; every other type in
# tests/ring/test_model_matrix.py). (type, ranks, layers per rank or None for an even split,
# quantized bits or 0)
TESTED = [
    ("llama", 3, None, 0),  # 7 layers as 3,2,2
    ("qwen2", 3, "1,4,2", 0),  # tied embeddings, biases, custom uneven split
    ("qwen3", 3, "3,1,3", 0),  # q/k norms
    ("llama", 2, "6,1", 0),
    ("mistral", 3, "1,3,3", 0),  # one KV head
    ("phi3", 3, "2,2,3", 0),  # fused qkv and gate-up projections, partial rotary
    ("qwen3_moe", 3, "1,3,3", 0),  # a dense first layer, then mixtures of 4 experts (2 per token)
    ("llama", 2, "5,2", 4),
    ("qwen3_moe", 3, "2,3,2", 8),  # mlx-lm's quantized layers too
]
BATCHED = [("qwen3", 2, 1, 16), ("qwen3", 2, 2, 16), ("qwen3", 3, 3, 4)]


PROMPT = [5, 17, 42, 99, 3, 250, 7]
LONE = [{"prompt": PROMPT, "max_tokens": 6, "at": 0}]


def tiny_cases() -> dict:
    """This file's tiny-model runs by name: (ranks, type, bits, layers per rank or None,
    ring_driver's --case). Every test's runs on a rank count share one launch (the `tiny`
    fixture): startup is most of a run this short."""
    cases = {
        f"logits {kind} {n} {layers} {bits}": (n, kind, bits, layers, {"spec": LONE})
        for kind, n, layers, bits in TESTED
    }
    for kind, n, groups, chunk in BATCHED:
        cases[f"batched {kind} {n} {groups} {chunk}"] = (
            n,
            kind,
            0,
            None,
            {"spec": MIXED, "groups": groups, "chunk": chunk},
        )
    # the second first times 1 and 2 groups on the ring (the warm-up's choice), then runs 2
    for groups in (1, 2):
        cases[f"overlap {groups}"] = (
            2,
            "llama",
            0,
            None,
            {"spec": MIXED, "groups": groups, "chunk": 3, "choose_groups": 4 * (groups - 1)},
        )
    for n, layers, budget, spec, _, _ in PROMPT_CACHE:
        cases[f"prompt cache {n} {layers} {budget}"] = (
            n,
            "llama",
            0,
            layers,
            {"spec": spec, "chunk": 16, "prompt_cache": budget},
        )
    cases["prefill together"] = (
        3,
        "llama",
        0,
        "3,2,2",
        {"spec": TOGETHER, "chunk": 64, "prompt_cache": 1000},
    )
    cases["follow up"] = (
        3,
        "llama",
        0,
        "3,2,2",
        {"spec": FOLLOW, "chunk": 16, "prompt_cache": 1000},
    )
    return cases


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """{case name: (its output folder, its model)}, run as tiny_cases() says: one
    launch per rank count."""
    tmp, models, outs = tmp_path_factory.mktemp("tiny"), {}, {}
    cases = tiny_cases()
    for n in sorted({c[0] for c in cases.values()}):
        mine = {name: c for name, c in cases.items() if c[0] == n}
        for i, (name, (_, kind, bits, _, _)) in enumerate(mine.items()):
            if (kind, bits) not in models:  # the same seed: the model each test made for itself
                models[kind, bits] = make_tiny_model(tmp / f"{kind}-{bits}", kind, bits=bits)
            outs[name] = tmp / str(n) / f"case{i}"
            outs[name].mkdir(parents=True)
        argv = [
            DRIVER,
            "--model",
            *(str(models[c[1], c[2]]) for c in mine.values()),
            "--out",
            *(str(outs[x]) for x in mine),
            "--layers",
            *(c[3] or "-" for c in mine.values()),
            "--case",
            *(json.dumps(c[4]) for c in mine.values()),
        ]
        launch(n, tmp / str(n), argv, timeout=120 + 60 * len(mine))
    return {name: (outs[name], models[c[1], c[2]]) for name, c in cases.items()}


@pytest.mark.parametrize("n", [2, 3])
def test_tiny_models_logits_match_single_process(tiny, n):
    """Each case of TESTED for n ranks, one after another in one launch."""
    for kind, layers, bits in [(kind, layers, bits) for kind, k, layers, bits in TESTED if k == n]:
        out, model = tiny[f"logits {kind} {n} {layers} {bits}"]
        tokens, logits, status, ranks = read_probe(out, n, LONE)
        want, want_tokens = reference_logits(model, PROMPT, steps=6)
        case = f"{kind} {layers} {bits}-bit"
        # prefill and 5 cached decode steps
        np.testing.assert_allclose(logits[0], want, rtol=1e-5, atol=1e-5, err_msg=case)
        assert tokens[0] == want_tokens, case
        # freed on every rank
        assert all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in status), case
        if layers:
            assert [r["layers"][1] - r["layers"][0] for r in ranks] == [
                int(x) for x in layers.split(",")
            ], case


# Sequences of different lengths arriving and leaving mid-flight (`at`: the
# scheduler step it joins).
MIXED = [
    {"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 12, "at": 0},
    {"prompt": [8, 1], "max_tokens": 16, "at": 0},
    {"prompt": [300, 2, 9, 9, 41, 7, 7, 12, 60, 1, 4], "max_tokens": 5, "at": 3},
    {"prompt": [77], "max_tokens": 10, "at": 7},
    {"prompt": [6, 5, 4, 3, 2, 1], "max_tokens": 8, "at": 15},
]


@pytest.mark.parametrize("kind,n,groups,chunk", BATCHED)
def test_batched_sequences_match_each_run_alone(tiny, kind, n, groups, chunk):
    """Continuous batching, prefill (chunks of 4: a long prompt in several chunks; of 16: waiting
    prompts right-padded into one batch) and micro-batch groups: every sequence's logits agree with
    single-process mlx-lm running it alone within float rounding of the batch shapes (atol 1e-4 on
    logits of order 1), and its tokens are identical."""
    out, model = tiny[f"batched {kind} {n} {groups} {chunk}"]
    check_batched(out, n, kind, model, chunk, groups)


def check_batched(out_dir, n, kind, model, chunk, groups=1):
    tokens, logits, status, _ = read_probe(out_dir, n, MIXED)
    for i, s in enumerate(MIXED):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        np.testing.assert_allclose(
            logits[i], want, rtol=1e-4, atol=1e-4, err_msg=f"{kind}: sequence {i}"
        )
        assert tokens[i] == want_tokens, f"{kind}: sequence {i}"
    assert all(
        r["open_sequences"] == 0 and r["cached_tokens"] == 0 and r["kv_cache_kib"] == 0
        for r in status
    ), kind
    assert all(r["kv_cache_peak_kib"] > 0 for r in status), kind
    result = json.loads((out_dir / "result.json").read_text())
    rows = result["prefill_rows"]  # rows of each prefill step
    if kind in UNBATCHED:  # one request a decode group, each prompt alone
        assert max(rows) == max(result["decode_rows"]) == 1 and len(result["decode_rows"]) > 0, kind
    # sliding or recurrent layers
    elif not plain_kv_caches(make_prompt_cache(load_model(model, lazy=True)[0])):
        # each prompt prefilled alone: padding would enter a window or a state
        assert max(rows) == 1, (kind, rows)
    elif chunk == 16 and groups > 1:  # the two prompts that arrive together go one to each group
        assert max(rows) == 1, (kind, rows)
    # the two prompts that arrive together (7 and 2 tokens, 14 once padded) share a step
    elif chunk == 16:
        assert max(rows) >= 2, (kind, rows)
    else:  # the 7-, 11- and 6-token prompts go alone, in 2, 3 and 2 chunks
        assert len(rows) >= 7, (kind, rows)


def test_overlap_changes_no_token(tiny):
    """The same requests give bitwise the same tokens with 1 group or 2 groups in flight. Before the
    second run, the warm-up's choice of groups times both counts on the ring and keeps the faster,
    leaving nothing behind."""
    runs = [read_probe(tiny[f"overlap {groups}"][0], 2, MIXED)[0] for groups in (1, 2)]
    assert runs[0] == runs[1]
    chosen = json.loads((tiny["overlap 2"][0] / "result.json").read_text())["chosen"]
    rate = {int(g): v for g, v in chosen["rate"].items()}
    assert sorted(rate) == [1, 2] and min(rate.values()) > 0, chosen
    assert chosen["groups"] == max(rate, key=rate.get) and chosen["idle"], chosen


P = [(7 * i + 3) % 300 + 1 for i in range(40)]  # a long first turn
X, Y, Q = (
    [11, 12, 13, 14, 15, 16, 17, 18, 19, 20],
    [201, 202, 203, 204, 205, 206, 207],
    [(5 * i) % 290 + 2 for i in range(30)],
)


PROMPT_CACHE = [
    # Turns of one chat, each prompt extending the last; an unrelated prompt meanwhile; two short
    # prompts prefilled as one padded batch, each followed up (their rows saved from the batch).
    (
        2,
        "5,2",
        1000,
        [
            {"prompt": P, "max_tokens": 4, "at": 0},
            {"prompt": P + X, "max_tokens": 5, "after": 0},
            {"prompt": P + X + Y, "max_tokens": 3, "after": 1},
            {"prompt": Q, "max_tokens": 3, "after": 1},
            {"prompt": [5, 6, 7, 8, 9, 10, 11], "max_tokens": 3, "after": 3},
            {"prompt": [9, 8, 7, 6, 5], "max_tokens": 3, "after": 3},
            {"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13], "max_tokens": 3, "after": 4},
            {"prompt": [9, 8, 7, 6, 5, 4], "max_tokens": 3, "after": 5},
        ],
        40 + 10 + 7 + 30 + 7 + 5 + 2 + 1,
        4,
    ),
    # Two prompts that start alike arrive together (and a short one beside them): the second waits
    # for the first's prefill and runs only what differs; the short one goes meanwhile.
    (
        3,
        "3,2,2",
        1000,
        [
            {"prompt": P + X, "max_tokens": 3, "at": 0},
            {"prompt": P + Y, "max_tokens": 3, "at": 0},
            {"prompt": [7, 7, 7], "max_tokens": 2, "at": 0},
        ],
        50 + 7 + 3,
        1,
    ),
    # A budget of 60 tokens: each new prompt evicts the last, so nothing hits
    # and answers stay exact.
    (
        3,
        "2,3,2",
        60,
        [
            {"prompt": P, "max_tokens": 4, "at": 0},
            {"prompt": Q, "max_tokens": 3, "after": 0},
            {"prompt": P + X, "max_tokens": 3, "after": 1},
        ],
        40 + 30 + 50,
        0,
    ),
]
# The first answer is one token, sampled from its prefill: the cache then holds P exactly.
TOGETHER = [
    {"prompt": P, "max_tokens": 1, "at": 0},
    *({"prompt": P + tail, "max_tokens": 4, "after": 0} for tail in (X, Y, Q[:5])),
]
FOLLOW = [
    {"prompt": P, "max_tokens": 5, "at": 0},
    {"prompt": X, "max_tokens": 4, "after": 0, "follow": 0},
    {"prompt": Y, "max_tokens": 3, "after": 1, "follow": 1},
]


@pytest.mark.parametrize("n,layers,budget,spec,prefilled,hits", PROMPT_CACHE)
def test_prompt_cache_prefills_only_new_tokens_and_changes_no_logit(
    tiny, n, layers, budget, spec, prefilled, hits
):
    """A prompt that starts like a cached one starts from that cache on every rank:
    each rank prefills only the new tokens, and the logits equal single-process
    mlx-lm's for the whole prompt."""
    out, model = tiny[f"prompt cache {n} {layers} {budget}"]
    tokens, logits, status, _ = read_probe(out, n, spec)
    for i, s in enumerate(spec):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        np.testing.assert_allclose(logits[i], want, rtol=1e-4, atol=1e-4, err_msg=f"sequence {i}")
        assert tokens[i] == want_tokens, f"sequence {i}"
    # the padded batch of 7 and 5 tokens runs 14 positions for 12 tokens
    padding = 2 if len(spec) == 8 else 0
    assert [r["prefill_tokens"] for r in status] == [prefilled + padding] * n
    cache = json.loads((out / "result.json").read_text())["prompt_cache"]
    assert cache["hits"] == hits
    assert (
        len({r["prompt_cache_entries"] for r in status}) == 1
        and status[0]["prompt_cache_entries"] == cache["entries"]
    )
    assert all(r["open_sequences"] == 0 and r["kv_cache_kib"] == 0 for r in status)


def test_prompts_that_start_from_one_cached_prompt_prefill_together(tiny):
    """Prompts that arrive together and start like a cached prompt (a chat template's system prompt,
    say) each start from it and prefill the rest as one padded batch: one LOAD, one PREFILL and one
    SAVE step for all of them, every rank running only their new tokens, and the logits exact."""
    out, model = tiny["prefill together"]
    tokens, logits, status, _ = read_probe(out, 3, TOGETHER)
    for i, s in enumerate(TOGETHER):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        np.testing.assert_allclose(logits[i], want, rtol=1e-4, atol=1e-4, err_msg=f"sequence {i}")
        assert tokens[i] == want_tokens, f"sequence {i}"
    result = json.loads((out / "result.json").read_text())
    assert result["prefill_rows"] == [1, 3]
    assert (
        result["steps"].count("LOAD"),
        result["steps"].count("SAVE"),
        result["prompt_cache"]["hits"],
    ) == (1, 2, 3)
    # the batch: 3 rows padded to X's 10
    assert [r["prefill_tokens"] for r in status] == [len(P) + 3 * len(X)] * 3


def test_a_follow_up_turn_starts_from_the_last_answer_too(tiny):
    """A sequence that leaves keeps its prompt and answer: the next turn (prompt, answer, new
    message) prefills little more than the new message on every rank, and its logits stay exact."""
    out, model = tiny["follow up"]
    tokens, logits, status, _ = read_probe(out, 3, FOLLOW)
    prompts = json.loads((out / "result.json").read_text())["prompts"]
    assert prompts[2] == P + tokens[0] + X + tokens[1] + Y
    for i, s in enumerate(FOLLOW):
        want, want_tokens = reference_logits(model, prompts[i], steps=s["max_tokens"])
        np.testing.assert_allclose(logits[i], want, rtol=1e-4, atol=1e-4, err_msg=f"sequence {i}")
        assert tokens[i] == want_tokens, f"sequence {i}"
    # each answer's last token may not have gone through the model before its sequence left
    prefilled = {r["prefill_tokens"] for r in status}
    assert (
        len(prefilled) == 1
        and len(P) + len(X) + len(Y) <= prefilled.pop() <= len(P) + len(X) + len(Y) + 2
    )
