"""Ollama's API in process, through the official `ollama` Python client (its httpx client
carries the in-process app's transport), against the stand-in engine with the default model's
real tokenizer: chat and generate whole and streamed, options as sampling parameters, tools,
formats, listings, errors."""

import json

import ollama
import pytest
from apiutil import ANSWER, CALL, MODEL, WEATHER, Bridge, FakeEngine, client, templated

from mlx_ring.api.keys import Key

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER,
        },
    }
]


def sdk(http, **kw) -> ollama.Client:
    return ollama.Client(host="http://testserver", transport=Bridge(http), **kw)


@pytest.fixture
def ol(engine, served):
    with client(engine, served) as http:
        yield sdk(http)


def test_chat_with_options_as_sampling(ol, engine, served):
    r = ol.chat(
        model=MODEL,
        messages=QUESTION,
        options={
            "temperature": 0,
            "top_k": 7,
            "num_predict": 50,
            "seed": 3,
            "stop": ["Rome"],
            "repeat_penalty": 1.1,
            "num_ctx": 4096,
        },
    )
    [[req]] = engine.submitted
    assert (
        req.prompt == templated(served, QUESTION) and req.max_tokens == 50 and req.stop == ["Rome"]
    )
    p = req.params
    assert (p.temperature, p.top_k, p.seed, p.repetition_penalty) == (0, 7, 3, 1.1)
    assert (r.message.role, r.message.content, r.done, r.done_reason) == (
        "assistant",
        ANSWER,
        True,
        "stop",
    )
    assert (r.prompt_eval_count, r.eval_count) == (
        len(req.prompt),
        len(engine.answer_ids()) + 1,
    ) and r.model == MODEL


def test_chat_streams_ndjson(ol, engine):
    parts = list(
        ol.chat(model=MODEL + ":latest", messages=QUESTION, stream=True, options={"num_predict": 4})
    )
    assert "".join(p.message.content for p in parts) == "The capital of France"
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 4


def test_generate_templates_the_prompt_unless_raw(ol, engine, served):
    r = ol.generate(model=MODEL, prompt="What is the capital of France?", system="Be brief.")
    assert r.response == ANSWER and r.done
    assert engine.submitted[0][0].prompt == templated(
        served, [{"role": "system", "content": "Be brief."}, *QUESTION]
    )
    streamed = list(
        ol.generate(model=MODEL, prompt="The capital of France is", raw=True, stream=True)
    )
    assert engine.submitted[1][0].prompt == served.tokenizer.encode("The capital of France is")
    assert "".join(p.response for p in streamed) == ANSWER and streamed[-1].done
    # an empty prompt only loads
    assert ol.generate(model=MODEL).done_reason == "load" and len(engine.submitted) == 2


def test_tools_and_results_without_ids(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    with client(engine, tool_served) as http:
        ol = sdk(http)
        r = ol.chat(model=MODEL, messages=QUESTION, tools=TOOLS)
        [call] = r.message.tool_calls
        assert (call.function.name, call.function.arguments, r.message.content) == (
            "get_weather",
            {"city": "Paris"},
            "",
        )
        engine.answer = "It is sunny."
        turn = [
            *QUESTION,
            r.message,
            {"role": "tool", "tool_name": "get_weather", "content": "Sunny"},
        ]
        assert ol.chat(model=MODEL, messages=turn, tools=TOOLS).message.content == "It is sunny."
        chat = [
            *QUESTION,
            # an answer of this server's comes back as the model wrote it
            {"role": "assistant", "content": CALL},
            {"role": "tool", "tool_call_id": "call_1_0", "content": "Sunny"},
        ]
        assert engine.submitted[1][0].prompt == templated(tool_served, chat, tools=TOOLS)
        assert "tools" in ol.show(MODEL).capabilities


def test_format_is_enforced_by_the_grammar(ol, engine):
    ol.chat(model=MODEL, messages=QUESTION, format="json")
    ol.chat(
        model=MODEL,
        messages=QUESTION,
        format={"type": "object", "properties": {"name": {"type": "string"}}},
    )
    assert all(reqs[0].params.grammar is not None for reqs in engine.submitted)


def test_listings(ol, served):
    [m] = ol.list().models
    assert (
        m.model == MODEL
        and m.size == sum(r.parameter_bytes_kib for r in served.cluster.ranks) * 1024
    )
    show = ol.show(MODEL)
    assert show.capabilities == ["completion"] and show.template == served.tokenizer.chat_template
    info = show.modelinfo
    assert (
        info["general.architecture"] == "llama"
        and info["llama.context_length"] == served.context_length == 8192
    )
    assert (
        info["llama.embedding_length"],
        info["llama.block_count"],
        info["general.parameter_count"],
    ) == (576, 30, 134515008)
    assert (show.details.family, show.details.parameter_size, show.details.quantization_level) == (
        "llama",
        "134.52M",
        "float32",
    )
    assert [p.model for p in ol.ps().models] == [MODEL]


def test_version_and_errors_in_ollamas_shape(engine, served):
    with client(engine, served) as http:
        assert http.get("/api/version").json()["version"]
        r = http.post(
            "/api/chat", json={"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}
        )
        assert (
            r.status_code == 400
            and list(r.json()) == ["error"]
            and "messages.0.role" in r.json()["error"]
        )
        ol = sdk(http)
        with pytest.raises(ollama.ResponseError) as e:
            ol.chat(model="llama3.2", messages=QUESTION)
        assert e.value.status_code == 404 and "llama3.2" in e.value.error
        with pytest.raises(ollama.ResponseError, match="options.temperature"):
            ol.chat(model=MODEL, messages=QUESTION, options={"temperature": 5})
        with pytest.raises(ollama.ResponseError, match="images are not supported"):
            ol.chat(model=MODEL, messages=[{"role": "user", "content": "hi", "images": ["AAAA"]}])
        engine.fail_after = 2
        with pytest.raises(ollama.ResponseError, match="a rank stopped"):
            list(ol.chat(model=MODEL, messages=QUESTION, stream=True))


def test_keys_guard_ollamas_routes(engine, served):
    with client(engine, served, [Key("alice", b"Bearer sk-alice-1")]) as http:
        with pytest.raises(ollama.ResponseError) as e:
            sdk(http).list()
        assert e.value.status_code == 401
        assert sdk(http, headers={"Authorization": "Bearer sk-alice-1"}).list().models


# The headers the Ollama CLI's Go client sends (api/client.go: do, and stream with NDJSON).
CLI = {
    "Content-Type": "application/json",
    "Accept": "application/json",
    "User-Agent": "ollama/0.12.0 (arm64 darwin) Go/go1.24.6",
}
NDJSON = CLI | {"Accept": "application/x-ndjson"}


def test_the_ollama_clis_requests(engine, served):
    """`ollama run`, `list`, `ps`, `show` and `stop` as the CLI sends them (cmd/cmd.go,
    api/types.go): the heartbeat first, ShowRequest with all its fields, GenerateRequest's load
    and unload, then the chat."""
    with client(engine, served) as http:
        for path in ("/", "/api/tags", "/api/version"):
            assert http.head(path, headers=CLI).status_code == 200, path
        shown = {
            "model": MODEL,
            "system": "",
            "template": "",
            "verbose": False,
            "options": None,
            "name": "",
        }
        r = http.post("/api/show", headers=CLI, json=shown)
        assert (
            r.status_code == 200
            and r.json()["model_info"]["llama.context_length"] == served.context_length
        )
        r = http.post("/api/show", headers=CLI, json=shown | {"model": "llama3.2"})
        # `ollama stop` looks for "not found"
        assert r.status_code == 404 and "model 'llama3.2' not found" in r.json()["error"]
        load = {
            "model": MODEL,
            "prompt": "",
            "suffix": "",
            "system": "",
            "template": "",
            "options": None,
        }
        assert http.post("/api/generate", headers=NDJSON, json=load).json()["done_reason"] == "load"
        assert (
            http.post("/api/generate", headers=NDJSON, json=load | {"keep_alive": "0s"}).json()[
                "done_reason"
            ]
            == "unload"
        )
        assert (
            http.post(
                "/api/chat", headers=NDJSON, json={"model": MODEL, "messages": [], "keep_alive": 0}
            ).json()["done_reason"]
            == "unload"
        )
        assert not engine.submitted
        chat = {"model": MODEL + ":latest", "messages": QUESTION, "options": {}}
        lines = [
            json.loads(ln)
            for ln in http.post("/api/chat", headers=NDJSON, json=chat).text.splitlines()
        ]
        assert (
            "".join(ln["message"]["content"] for ln in lines) == ANSWER
            and lines[-1]["done_reason"] == "stop"
        )
        assert [m["name"] for m in http.get("/api/ps", headers=CLI).json()["models"]] == [MODEL]


def test_durations_are_measured_whole_and_streamed(ol):
    for r in (
        ol.chat(model=MODEL, messages=QUESTION),
        list(ol.chat(model=MODEL, messages=QUESTION, stream=True))[-1],
    ):
        assert r.prompt_eval_duration > 0 and r.eval_duration > 0 and r.load_duration == 0
        assert r.total_duration >= r.prompt_eval_duration + r.eval_duration


def test_aliases_answer_and_names_are_listed(engine, served):
    with client(engine, served, aliases=("claude-*", "smol")) as http:
        ol = sdk(http)
        assert [m.model for m in ol.list().models] == [MODEL, "smol"]
        assert ol.chat(model="smol:latest", messages=QUESTION).message.content == ANSWER
        assert ol.show("claude-sonnet-4-5").details.family == "llama"
        with pytest.raises(ollama.ResponseError) as e:
            ol.chat(model="gpt-4o", messages=QUESTION)
        assert e.value.status_code == 404 and "not found" in e.value.error
