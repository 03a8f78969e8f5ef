"""The OpenAI API's answers in process against a stand-in engine (tests/apiutil.py), with the
default model's real tokenizer and chat template: chat and completions whole and streamed, their
logprobs and usage, n choices, the fields clients add, and the names the model is served by."""

import openai
import pytest
from apiutil import ANSWER, MODEL, client
from openaiutil import QUESTION, events


@pytest.fixture
def oa(http):
    """The official client, over the in-process app."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
    )


def test_a_chat_answer_in_openai_shape(oa, engine, served):
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    prompt = served.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    [[req]] = engine.submitted
    assert req.prompt == prompt and req.params.temperature == 0 and req.max_tokens == 512
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    [choice] = r.choices
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "stop", None)
    assert (choice.message.role, choice.message.content, choice.message.tool_calls) == (
        "assistant",
        ANSWER,
        None,
    )
    n = len(engine.answer_ids()) + 1  # and the end token
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(prompt),
        n,
        len(prompt) + n,
    )
    assert engine.cancelled == [req]  # every request is released when its answer ends


def test_length_limit_and_chat_logprobs(oa, engine, served):
    r = oa.chat.completions.create(
        model=MODEL, messages=QUESTION, max_completion_tokens=3, logprobs=True, top_logprobs=2
    )
    ids = engine.answer_ids()[:3]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert r.choices[0].message.content == served.tokenizer.decode(ids) == "The capital of"
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [served.tokenizer.decode([i]) for i in ids] and [
        c.logprob for c in content
    ] == [-0.5] * 3
    assert [[t.logprob for t in c.top_logprobs] for c in content] == [[-0.5, -1.5]] * 3
    assert content[0].bytes == list(content[0].token.encode())


def test_completions_with_logprobs_and_models(oa, engine, served):
    r = oa.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, logprobs=2
    )
    [[req]] = engine.submitted
    assert req.prompt == served.tokenizer.encode("The capital of France is")
    assert (
        r.object == "text_completion"
        and r.id.startswith("cmpl-")
        and r.choices[0].finish_reason == "length"
    )
    assert r.choices[0].text == "The capital of France"
    lp = r.choices[0].logprobs
    assert (
        len(lp.tokens) == 4
        and lp.token_logprobs == [-0.5] * 4
        and all(len(t) == 2 for t in lp.top_logprobs)
    )
    ids = oa.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)
    assert engine.submitted[1][0].prompt == [1, 2, 3] and ids.usage.prompt_tokens == 3
    assert [(m.id, m.object, m.owned_by) for m in oa.models.list().data] == [
        (MODEL, "model", "mlx-ring")
    ]


def test_a_stream_is_role_content_finish_usage_done(http, engine):
    ask = {
        "model": MODEL,
        "messages": QUESTION,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = http.post("/v1/chat/completions", json=ask)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    *chunks, usage, done = events(r)
    assert done == "[DONE]"
    assert {c["object"] for c in chunks + [usage]} == {"chat.completion.chunk"} and len(
        {c["id"] for c in chunks + [usage]}
    ) == 1
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": None,
            "delta": {"role": "assistant", "content": ""},
        }
    ]
    assert chunks[-1]["choices"] == [
        {"index": 0, "logprobs": None, "finish_reason": "stop", "delta": {}}
    ]
    middle = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    assert (
        all(set(d) == {"content"} for d in middle)
        and "".join(d["content"] for d in middle) == ANSWER
    )
    n = len(engine.answer_ids()) + 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    whole = http.post("/v1/chat/completions", json={"model": MODEL, "messages": QUESTION}).json()
    assert whole["choices"][0]["message"]["content"] == ANSWER and whole["usage"] == usage["usage"]


def test_a_completions_stream_and_a_stop_string(http):
    r = http.post("/v1/completions", json={"prompt": "Say it.", "stream": True, "stop": [" Paris"]})
    *chunks, done = events(r)
    assert done == "[DONE]" and {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == "The capital of France is"
    assert [
        c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]
    ] == ["stop"]


def test_n_choices_are_queued_together_each_after_the_first(oa, engine):
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION, n=3, seed=7, temperature=1)
    [reqs] = engine.submitted
    assert [q.after for q in reqs] == [None, reqs[0], reqs[0]]
    # each choice its own seed, derived from the request's
    assert len({q.params.seed for q in reqs}) == 3
    assert [c.index for c in r.choices] == [0, 1, 2] and {c.message.content for c in r.choices} == {
        ANSWER
    }
    n = len(engine.answer_ids()) + 1
    assert r.usage.completion_tokens == 3 * n and r.usage.prompt_tokens == len(reqs[0].prompt)


def test_fields_clients_add_are_accepted(oa, engine):
    r = oa.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=3,
        temperature=0,
        store=True,
        metadata={"app": "test"},
        user="u-1",
        service_tier="auto",
        prompt_cache_key="k",
        parallel_tool_calls=False,
    )
    assert (
        r.choices[0].message.content == "The capital of" and r.choices[0].finish_reason == "length"
    )
    assert engine.tokenizer.decode(engine.submitted[0][0].prompt).endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_cached_tokens_in_usage_whole_and_streamed(oa, engine):
    assert (
        oa.chat.completions.create(
            model=MODEL, messages=QUESTION
        ).usage.prompt_tokens_details.cached_tokens
        == 0
    )
    engine.cached = 7
    r = oa.chat.completions.create(model=MODEL, messages=QUESTION)
    assert (r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens) == (
        7,
        len(engine.submitted[-1][0].prompt),
    )
    chunks = list(
        oa.chat.completions.create(
            model=MODEL, messages=QUESTION, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 7
    assert (
        oa.completions.create(
            model=MODEL, prompt="The capital of France is"
        ).usage.prompt_tokens_details.cached_tokens
        == 7
    )


def test_served_name_and_aliases(engine, served):
    with client(engine, served, id="smol", aliases=("claude-*", "gpt-4o")) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        assert [m.id for m in oa.models.list().data] == ["smol", "gpt-4o"]
        r = oa.chat.completions.create(model="claude-sonnet-4-5", messages=QUESTION)
        # the answer names the model that gave it
        assert r.choices[0].message.content == ANSWER and r.model == "smol"
        assert (
            oa.models.retrieve("claude-opus-4-1").id == "claude-opus-4-1"
            and oa.models.retrieve("default").id == "smol"
        )
        for name in (MODEL, "gpt-4o-mini"):
            with pytest.raises(openai.NotFoundError) as e:
                oa.chat.completions.create(model=name, messages=QUESTION)
            assert (
                e.value.body["code"] == "model_not_found"
                and "MODEL_ALIASES" in e.value.body["message"]
            )
        with pytest.raises(openai.NotFoundError):
            oa.models.retrieve("gpt-4o-mini")
