"""What chat apps and agent frameworks send, through the official `openai` client against the
real 2-rank server: tool calls, JSON and JSON-schema answers, n choices and speculative decoding
(a chat's next turns from the prompt cache: test_chat_turns.py). (What is refused, the fields
clients add and the shape of tool calls: tests/unit/api/test_openai_errors.py,
test_openai_answers.py and test_openai_tools.py, in process.) The model is the default one (real
weights) under a Qwen2.5-style template that offers tools (tests/data/tools_chat_template.jinja)."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from mlx_lm.utils import load_tokenizer
from ringutil import mlx_lm_answer, tool_model
from serverutil import running_server

WEATHER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "unit"],
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
}
TIME = {
    "type": "object",
    "additionalProperties": False,
    "required": ["zone"],
    "properties": {"zone": {"type": "string", "maxLength": 12}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a time zone",
            "parameters": TIME,
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, default_model):
    tmp = tmp_path_factory.mktemp("chat")
    model = tool_model(tmp / "model", default_model)
    # Drafts on (prompt lookup): every answer below goes through verify passes where
    # a draft is found.
    with running_server(
        tmp, n_ranks=2, extra_args=["--model", str(model), "--draft-tokens", "6"]
    ) as (url, _):
        yield url, model


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused", max_retries=0, timeout=300)


def status(url) -> dict:
    return httpx.get(f"{url}/cluster/status", timeout=30).json()


def test_a_named_tool_is_called_in_openai_shape_whole_and_streamed(client):
    ask = dict(
        model="default",
        messages=ASK,
        tools=TOOLS,
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    r = client.chat.completions.create(**ask)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (
        call.type == "function"
        and call.function.name == "get_weather"
        and call.id.startswith("call_")
    )
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    [head, *rest] = [
        c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls
    ]
    assert (
        head.index == 0
        and head.id
        and (head.function.name, head.function.arguments) == ("get_weather", "")
    )
    # the arguments as they are generated, joining to the non-streamed answer's
    assert (
        len(rest) > 1
        and {d.index for d in rest} == {0}
        and "".join(d.function.arguments for d in rest) == call.function.arguments
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        "tool_calls"
    ]


def test_required_calls_one_of_the_tools_and_none_answers_in_text(client):
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    [call] = r.choices[0].message.tool_calls
    jsonschema.validate(
        json.loads(call.function.arguments),
        {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name],
    )
    r = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    # none: the template offers no tools and the answer is text (single-process mlx-lm's greedy one)
    assert r.choices[0].message.tool_calls is None
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (
        "Paris, the City of Light, is a city renowned for",
        "length",
    )


def test_a_tool_result_turn_is_answered_as_mlx_lm(client):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    result = {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"}
    r = client.chat.completions.create(
        model="default",
        messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [call]}, result],
        tools=TOOLS,
        max_tokens=16,
        temperature=0,
    )
    # single-process mlx-lm's greedy answer to the same template (the call's arguments as an
    # object): text that starts like a tool-call marker and is not one
    assert r.choices[0].message.tool_calls is None
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (
        '<tool_response>\n{"type": "response", "data": {',
        "length",
    )


SCHEMAS = [
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "age", "sailor"],
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "sailor": {"type": "boolean"},
        },
    },
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["colours"],
        "properties": {
            "colours": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3,
            }
        },
    },
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["city", "population"],
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
        },
    },
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["answer"],
        "properties": {"answer": {"enum": ["yes", "no"]}},
    },
]


def json_answer(client, schema, i=0):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": f"s{i}", "schema": schema, "strict": True},
    }
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": f"Answer in JSON ({i})."}],
        response_format=fmt,
        max_tokens=80,
        temperature=0.7,
        seed=i,
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    return json.loads(r.choices[0].message.content)


def test_json_schema_answers_validate_also_eight_at_once(client):
    # 8 concurrent sequences, each with its own schema, in shared batches
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: json_answer(client, SCHEMAS[i % 4], i), range(8)))
    for i, a in enumerate(answers):
        jsonschema.validate(a, SCHEMAS[i % 4])
    r = client.chat.completions.create(
        model="default",
        response_format={"type": "json_object"},
        max_tokens=100,
        temperature=0,
        messages=[
            {
                "role": "user",
                "content": ('Reply with the JSON object {"ok": true} and nothing else.'),
            }
        ],
    )
    assert r.choices[0].finish_reason == "stop" and isinstance(
        json.loads(r.choices[0].message.content), dict
    )
    r = client.chat.completions.create(
        model="default", messages=ASK, response_format={"type": "text"}, max_tokens=4, temperature=0
    )
    assert r.choices[0].message.content == "Paris, the City"


def test_n_choices_share_one_prefill(client, served):
    """n choices prefill their prompt once, the others starting from it; a prompt shorter than the
    least the cache reuses (16 tokens: an eighth of this CPU's 128-token chunk) is prefilled for
    every choice, in one batch, without waiting."""
    for content, shared in (
        ("Tell me about a ship that sails the cold northern sea in the winter.", True),
        ("Hi.", False),
    ):
        before = status(served[0])
        r = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": content}],
            n=4,
            max_tokens=8,
            temperature=1.0,
            seed=3,
        )
        after = status(served[0])
        assert [c.index for c in r.choices] == [0, 1, 2, 3] and len(
            {c.message.content for c in r.choices}
        ) > 1
        p = r.usage.prompt_tokens
        assert p == len(
            load_tokenizer(served[1]).apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True
            )
        )
        assert (p - 1 >= 16) == shared
        reused = after["prompt_cache"]["hit_tokens"] - before["prompt_cache"]["hit_tokens"]
        prefilled = [
            a["prefill_tokens"] - b["prefill_tokens"]
            for b, a in zip(before["ranks"], after["ranks"])
        ]
        # one prefill of the prompt (less any start it shares with earlier prompts); each other
        # choice runs its last token
        if shared:
            assert reused >= 3 * (p - 1) and all(n == 4 * p - reused <= p + 3 for n in prefilled)
        else:
            assert reused == 0 and prefilled == [4 * p] * len(prefilled)


def test_answers_that_copy_their_input_keep_drafts_and_stay_exact(client, served):
    url, model = served
    tokenizer = load_tokenizer(model)
    ask = [
        {
            "role": "user",
            "content": (
                "Repeat this text exactly, word for word:\n\nThe keeper lit the lamp each evening, "
                "wound the clockwork that turned the lens, and wrote the weather in his log."
            ),
        }
    ]
    before = status(url)["speculative"]
    a = (
        client.chat.completions.create(model="default", messages=ask, max_tokens=30, temperature=0)
        .choices[0]
        .message.content
    )
    after = status(url)["speculative"]
    assert a == tokenizer.decode(
        mlx_lm_answer(
            model, tokenizer, tokenizer.apply_chat_template(ask, add_generation_prompt=True), 30
        )
    )
    assert after["draft_tokens"] == 6 and after["accepted"] - before["accepted"] >= 10
    sampled = client.chat.completions.create(
        model="default", messages=ask, max_tokens=30, temperature=0.7, seed=1, stream=True
    )
    # the rejection rule's path, streamed
    assert "".join(c.choices[0].delta.content or "" for c in sampled)
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert "mlx_ring_draft_tokens_accepted" in metrics
