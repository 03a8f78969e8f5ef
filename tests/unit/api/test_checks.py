"""Requests checked against the served model, without a ring: the edge every request crosses
before anything reaches MLX."""

import pytest

from mlx_ring.api.errors import ApiError
from mlx_ring.api.openai_request import ChatCompletionRequest, CompletionRequest
from mlx_ring.api.served import (
    ServedModel,
    check_ids,
    check_model,
    check_sampling,
    max_tokens_for,
    served_name,
)

SERVED = ServedModel(
    id="tiny",
    tokenizer=None,
    context_length=64,
    default_max_tokens=16,
    vocab_size=320,
    max_tokens_limit=32,
)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **fields}
    )


def rejected(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args)
    return e.value


def test_token_ids_must_index_the_vocabulary():
    check_sampling(SERVED, chat(logit_bias={"0": 1, "319": -100}, top_k=319))
    e = rejected(check_sampling, SERVED, chat(logit_bias={"320": 5}))
    assert (e.status, e.param) == (400, "logit_bias") and "[0, 320)" in e.message
    assert rejected(check_sampling, SERVED, chat(top_k=320)).param == "top_k"
    assert rejected(check_ids, SERVED, "prompt", [1, 2, 99_999_999]).param == "prompt"
    assert rejected(check_ids, SERVED, "prompt", [-1]).param == "prompt"


def test_lengths_fit_the_context_and_the_servers_limit():
    prompt = list(range(60))
    assert max_tokens_for(SERVED, prompt, chat()) == 4  # the room left, below the default of 16
    assert max_tokens_for(SERVED, prompt[:10], chat()) == 16
    # OpenAI's default
    assert (
        max_tokens_for(SERVED, prompt[:10], CompletionRequest.model_validate({"prompt": "x"})) == 16
    )
    assert (
        rejected(max_tokens_for, SERVED, prompt, chat(max_tokens=5)).code
        == "context_length_exceeded"
    )
    assert (
        rejected(max_tokens_for, SERVED, prompt[:10], chat(max_completion_tokens=33)).param
        == "max_completion_tokens"
    )
    assert (
        rejected(max_tokens_for, SERVED, list(range(64)), chat()).code == "context_length_exceeded"
    )


def test_lengths_fit_what_the_rings_memory_holds_for_one_request():
    held = ServedModel(
        id="tiny",
        tokenizer=None,
        context_length=64,
        default_max_tokens=16,
        vocab_size=320,
        request_kv_room=40,
    )
    # the room the KV cache has left, below the default
    assert max_tokens_for(held, list(range(30)), chat()) == 10
    e = rejected(max_tokens_for, held, list(range(30)), chat(max_tokens=11))
    assert (
        e.code == "context_length_exceeded"
        and "holds the KV cache of 40 tokens for one request" in e.message
    )
    assert "ask for at most 10" in e.message
    e = rejected(max_tokens_for, held, list(range(40)), chat())
    assert e.param == "messages" and "holds the KV cache of 40 tokens" in e.message


def test_only_the_served_model_is_known():
    for name in (None, "", "tiny", "default"):
        check_model(SERVED, name)
    e = rejected(check_model, SERVED, "gpt-17")
    assert (e.status, e.code) == (404, "model_not_found")


def test_aliases_name_the_model_by_name_or_pattern():
    aliased = ServedModel(
        id="tiny",
        tokenizer=None,
        context_length=64,
        default_max_tokens=16,
        vocab_size=320,
        aliases=("claude-*", "gpt-4o", "tiny"),
    )
    for name in (
        "claude-sonnet-4-5",
        "claude-3-5-haiku-20241022",
        "gpt-4o",
        "tiny",
        "default",
        None,
    ):
        check_model(aliased, name)
    for name in ("gpt-4o-mini", "Claude-x", "llama3.2"):
        e = rejected(check_model, aliased, name)
        assert (e.status, e.code) == (404, "model_not_found") and "MODEL_ALIASES" in e.message
    # patterns answer but are not listed; no name twice
    assert aliased.names() == ["tiny", "gpt-4o"]


def test_the_served_name_is_the_models_own_not_its_path(tmp_path):
    folder = tmp_path / "SmolLM2-135M-Instruct"
    folder.mkdir()
    default = "Default-Model"
    assert (
        served_name(None, str(folder), default)
        == served_name(None, f"{folder}/", default)
        == "SmolLM2-135M-Instruct"
    )
    assert (
        served_name(None, "~/models/gemma-3-270m-it-Q4_K_M.gguf", default)
        == "gemma-3-270m-it-Q4_K_M"
    )
    # a repo id, as vLLM
    assert (
        served_name(None, "mlx-community/Qwen3-0.6B-4bit", default)
        == "mlx-community/Qwen3-0.6B-4bit"
    )
    assert served_name(None, None, default) == served_name(None, "", default) == default
    assert served_name("smol", str(folder), default) == "smol"  # SERVED_MODEL_NAME wins
