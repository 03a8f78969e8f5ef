"""A chat's next turns through the official clients against the real 2-rank server: each prefills
only what is new, from the prompt cache, and answers as mlx-lm does; a turn after a tool call reuses
the call as the model wrote it. The model is the default one (real weights) under a Qwen2.5-style
template that offers tools (tests/data/tools_chat_template.jinja)."""

import json

import anthropic
import httpx
import openai
import pytest
from mlx_lm.utils import load_tokenizer
from ringutil import mlx_lm_answer, tool_model
from serverutil import running_server

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_model):
    tmp = tmp_path_factory.mktemp("turns")
    model = tool_model(tmp / "model", default_model)
    with running_server(tmp, n_ranks=2, extra_args=["--model", str(model)]) as (url, _):
        yield url, model


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=300)


def status(url) -> dict:
    return httpx.get(f"{url}/cluster/status", timeout=30).json()


def test_a_follow_up_turn_prefills_only_its_new_tokens_and_answers_as_mlx_lm(client, served):
    url, model = served
    tokenizer = load_tokenizer(model)
    turn1 = [{"role": "user", "content": "Write one sentence about the sea. " * 6}]
    a1 = (
        client.chat.completions.create(
            model="default", messages=turn1, max_tokens=12, temperature=0
        )
        .choices[0]
        .message.content
    )
    turn2 = turn1 + [
        {"role": "assistant", "content": a1},
        {"role": "user", "content": "Now one about the sky."},
    ]
    before = status(url)
    # the folder's name
    r2 = client.chat.completions.create(
        model=model.name, messages=turn2, max_tokens=12, temperature=0
    )
    a2 = r2.choices[0].message.content
    after = status(url)
    p1 = tokenizer.apply_chat_template(turn1, add_generation_prompt=True)
    p2 = tokenizer.apply_chat_template(turn2, add_generation_prompt=True)
    assert p2[: len(p1)] == p1
    # Turn 1's prompt and its answer (as far as the answer, written back by the template, tokenizes
    # the same) are reused: every rank runs only what follows.
    reused = after["prompt_cache"]["hit_tokens"] - before["prompt_cache"]["hit_tokens"]
    assert reused >= len(p1) and r2.usage.prompt_tokens_details.cached_tokens == reused
    for b, a in zip(before["ranks"], after["ranks"]):
        assert a["prefill_tokens"] - b["prefill_tokens"] == len(p2) - reused
        assert a["prompt_cache_entries"] >= 1 and a["prompt_cache_kib"] > 0
    assert a2 == tokenizer.decode(mlx_lm_answer(model, tokenizer, p2, 12))
    # The same conversation as Anthropic Messages: all but its last token from the cache (turn 2's
    # prompt and answer were saved), which Anthropic's usage counts apart from the input.
    m = anthropic.Anthropic(
        base_url=url, api_key="unused", max_retries=0, timeout=300
    ).messages.create(model="default", max_tokens=4, messages=turn2, extra_body={"temperature": 0})
    assert (m.usage.cache_read_input_tokens, m.usage.input_tokens) == (len(p2) - 1, 1)
    assert client.models.list().data[0].id == model.name  # not its absolute path


FORECAST = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "The forecast for a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["days", "city"],
            "properties": {
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "city": {"type": "string", "maxLength": 20},
            },
        },
    },
}


def test_a_turn_after_a_tool_call_reuses_the_call_as_the_model_wrote_it(client, served):
    url, model = served
    tokenizer = load_tokenizer(model)
    ask = dict(
        model="default",
        tools=[FORECAST],
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_forecast"}},
    )
    r1 = client.chat.completions.create(messages=ASK, **ask)
    message = r1.choices[0].message.model_dump(exclude_none=True)
    [call] = message["tool_calls"]
    # The model writes the schema's order (days, city); a client whose JSON objects keep no order
    # (Go's, serde_json's) sends the arguments back sorted, which the template would write so.
    args = json.loads(call["function"]["arguments"])
    assert list(args) == ["days", "city"]
    call["function"]["arguments"] = json.dumps(args, sort_keys=True)
    turn = [*ASK, message, {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"}]
    before = status(url)
    # "auto": the same tools offered, so the same system prompt
    r2 = client.chat.completions.create(messages=turn, **{**ask, "tool_choice": "auto"})
    after = status(url)
    reused = after["prompt_cache"]["hit_tokens"] - before["prompt_cache"]["hit_tokens"]
    p1 = tokenizer.apply_chat_template(ASK, tools=[FORECAST], add_generation_prompt=True)
    # the first prompt and every token of the call but the end token, whose KV was never written
    assert reused == r2.usage.prompt_tokens_details.cached_tokens
    assert reused >= len(p1) + r1.usage.completion_tokens - 1, (reused, len(p1))
