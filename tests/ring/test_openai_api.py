"""The real `openai` client against the real server: 2 ranks under mlx.launch, default model.
What the ring does end to end: answers as mlx-lm's, limits, stop strings, logprobs, seeds,
every rank's figures. The other dialects (Anthropic Messages, OpenAI Responses, Ollama)
through their own clients: the same greedy text. (Request checks and response shapes:
tests/unit/api/, in process.)"""

import socket
import time

import anthropic
import httpx
import ollama
import openai
import pytest
from apiutil import samples
from mlx_lm.utils import load_tokenizer
from ringutil import mlx_lm_answer
from serverutil import running_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, default_model):
    with running_server(tmp_path_factory.mktemp("server"), n_ranks=2) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_answers_like_single_process_mlx_lm(client, default_model):
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=32
    )
    tokenizer = load_tokenizer(default_model)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    want = mlx_lm_answer(default_model, tokenizer, prompt, 32)
    assert (
        r.choices[0].message.content == tokenizer.decode(want) == "The capital of France is Paris."
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
    # + end token
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want) + 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_length_limit_and_max_completion_tokens(client):
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_completion_tokens=3
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.choices[0].message.content == "The capital of"


def test_stop_string_cuts_text(client):
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, stop=[" Paris", "zzz"]
    )
    assert (
        r.choices[0].message.content == "The capital of France is"
        and r.choices[0].finish_reason == "stop"
    )
    s = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, stop=" Paris", stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in s if c.choices)
        == "The capital of France is"
    )


def test_completions_with_logprobs(client):
    r = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        logprobs=2,
    )
    # single-process mlx-lm's greedy tokens, through its streaming detokenizer (which
    # drops the leading space)
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == (
        "Paris.\n\n",
        "length",
        4,
    )
    assert len(r.choices[0].logprobs.tokens) == 4 and all(
        len(t) == 2 for t in r.choices[0].logprobs.top_logprobs
    )


def test_chat_logprobs_and_seeded_sampling(client):
    r = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        temperature=0,
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == ["The", " capital", " of", " France"]
    assert all(
        len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token and c.logprob <= 0
        for c in content
    )
    ask = dict(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        temperature=1.0,
        top_p=0.9,
        max_tokens=12,
        seed=7,
    )
    assert (
        client.chat.completions.create(**ask).choices[0].message.content
        == client.chat.completions.create(**ask).choices[0].message.content
    )


def test_health_and_cluster_status(server):
    h = httpx.get(f"{server}/health", timeout=30).json()
    assert h["status"] == "ok" and h["ranks"] == 2
    s = httpx.get(f"{server}/cluster/status", timeout=30).json()
    assert [r["layers"] for r in s["ranks"]] == [[0, 15], [15, 30]]
    # every finished request freed its caches
    assert [r["open_sequences"] for r in s["ranks"]] == [0, 0]
    # rank 0 adds embedding
    assert s["ranks"][0]["parameter_bytes_kib"] > s["ranks"][1]["parameter_bytes_kib"]


def scrape(url: str) -> dict:
    return samples(httpx.get(f"{url}/metrics", timeout=30).text)


def test_metrics_parse_and_move_with_requests(client, server):
    before = scrape(server)
    chat = ("mlx_ring_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    used = [c.usage for c in stream if c.usage][0]
    after = scrape(server)
    assert after[chat] == before.get(chat, 0) + 1
    for name, grew in (
        ("mlx_ring_completion_tokens_total", used.completion_tokens),
        ("mlx_ring_prompt_tokens_total", used.prompt_tokens),
        ("mlx_ring_time_to_first_token_seconds_count", 1),
    ):
        assert after[(name, ())] == before.get((name, ()), 0) + grew, name
    itl, steps = (
        ("mlx_ring_inter_token_latency_seconds_count", ()),
        ("mlx_ring_step_seconds_count", ()),
    )
    assert after[itl] >= before.get(itl, 0) + used.completion_tokens - 2 and after[
        steps
    ] > before.get(steps, 0)
    assert after[("mlx_ring_up", ())] == 1 and after[("mlx_ring_queue_depth", ())] == 0
    for rank in ("0", "1"):  # every rank's live figures, labelled with its rank and host
        who = (("host", socket.gethostname()), ("rank", rank))
        assert after[("mlx_ring_rank_memory_bytes", (who[0], ("kind", "peak"), who[1]))] > 0
        assert after[("mlx_ring_rank_busy_seconds_total", who)] > before.get(
            ("mlx_ring_rank_busy_seconds_total", who), 0
        )
        assert ("mlx_ring_rank_kv_cache_bytes", who) in after and (
            "mlx_ring_rank_stage_seconds",
            who,
        ) in after
        assert after[("mlx_ring_rank_prefill_tokens_total", who)] > before.get(
            ("mlx_ring_rank_prefill_tokens_total", who), 0
        )
        # the request left its prompt and answer
        assert after[("mlx_ring_rank_prompt_cache_bytes", who)] > 0
    assert after[("mlx_ring_prompt_cache_tokens", ())] > 0


def test_every_dialect_answers_as_chat_completions(client, server):
    model, n = "SmolLM2-135M-Instruct", 32
    want = (
        client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=n)
        .choices[0]
        .message.content
    )
    assert want == "The capital of France is Paris."
    ant = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0, timeout=120)
    assert (
        ant.messages.create(
            model=model, max_tokens=n, messages=QUESTION, extra_body={"temperature": 0}
        )
        .content[0]
        .text
        == want
    )
    with ant.messages.stream(
        model=model, max_tokens=n, messages=QUESTION, extra_body={"temperature": 0}
    ) as s:
        assert "".join(s.text_stream) == want
    assert ant.messages.count_tokens(model=model, messages=QUESTION).input_tokens > 0
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=model, max_tokens=0, messages=QUESTION)
    r = client.responses.create(
        model=model, input=QUESTION[0]["content"], temperature=0, max_output_tokens=n
    )
    assert r.output_text == want
    follow = client.responses.create(
        model=model,
        input="And of Italy?",
        previous_response_id=r.id,
        temperature=0,
        max_output_tokens=n,
    )
    assert follow.status == "completed" and follow.usage.input_tokens > r.usage.input_tokens
    streamed = client.responses.create(
        model=model, input=QUESTION, temperature=0, max_output_tokens=n, stream=True
    )
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == want
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=model, input=QUESTION, max_output_tokens=0)
    ol = ollama.Client(host=server, timeout=120)
    assert (
        ol.chat(
            model=model, messages=QUESTION, options={"temperature": 0, "num_predict": n}
        ).message.content
        == want
    )
    parts = ol.chat(
        model=model, messages=QUESTION, options={"temperature": 0, "num_predict": n}, stream=True
    )
    assert "".join(p.message.content for p in parts) == want
    assert (
        ol.generate(
            model=model, prompt=QUESTION[0]["content"], options={"temperature": 0, "num_predict": n}
        ).response
        == want
    )
    assert [m.model for m in ol.list().models] == [model]
    # the Ollama CLI's heartbeat, through uvicorn
    assert httpx.head(server, timeout=30).status_code == 200
    # what server.py gathers of the model: its config, parameters and weights (float32 on this CPU)
    show = ol.show(model)
    assert (show.modelinfo["general.architecture"], show.modelinfo["llama.context_length"]) == (
        "llama",
        8192,
    )
    assert (show.details.parameter_size, show.details.quantization_level) == ("134.52M", "float32")
    with pytest.raises(ollama.ResponseError):
        ol.chat(model=model, messages=QUESTION, options={"temperature": 5})
    # all freed: a finished sequence leaves rank 1 with the ring's next step
    deadline = time.monotonic() + 30
    while (
        httpx.get(f"{server}/cluster/status", timeout=30).json()["ranks"][1]["open_sequences"]
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert (
        httpx.get(f"{server}/cluster/status", timeout=30).json()["ranks"][1]["open_sequences"] == 0
    )
