"""The front door: no body jams the API. Bodies over MAX_BODY_BYTES get a 413 before anything reads
them; hostile bodies (huge, of the wrong shape, too long for the context) get their 400 without
holding the event loop, so a stream running meanwhile keeps its pace; and the messages a client
gets for the odd cases say what to do."""

import json
import multiprocessing
import threading
import time

import openai
import pytest
from apiutil import MODEL, FakeEngine, client
from fastapi.testclient import TestClient

from mlx_ring.api.app import make_app

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_body_over_the_limit_is_a_413_whole_or_chunked(engine, served):
    with client(engine, served, app_args={"max_body_bytes": 4096}) as http:
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        for r in (
            http.post("/v1/chat/completions", content=big),  # Content-Length says so at once
            # chunked: counted
            http.post("/v1/chat/completions", content=iter([big[:3000], big[3000:]])),
        ):
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
            assert "4096 bytes (MAX_BODY_BYTES)" in error["message"]
        small = json.dumps({"messages": QUESTION}).encode()
        assert (
            http.post("/v1/chat/completions", content=iter([small[:10], small[10:]])).status_code
            == 200
        )
    assert len(engine.submitted) == 1


@pytest.mark.parametrize(
    "path,body,param,says",
    [
        (
            "/v1/chat/completions",
            {"messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]},
            "stop",
            "at most 4 stop strings",
        ),
        ("/v1/completions", {"prompt": [1, -3, 2]}, "prompt", "token id -3 is negative"),
        (
            "/v1/completions",
            {"prompt": "hi", "seed": 1 << 63},
            "seed",
            "less than or equal to 9223372036854775807",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "seed": -(1 << 63) - 1},
            "seed",
            "greater than or equal to",
        ),
        (
            "/v1/chat/completions",
            {"messages": [1] * 100_000},
            "messages",
            "messages.0: Input should be",
        ),
        ("/v1/chat/completions", {"messages": QUESTION, "stop": [1] * 100_000}, "stop", "stop"),
    ],
)
def test_clear_messages_for_odd_requests(engine, served, path, body, param, says):
    with client(engine, served) as http:
        r = http.post(path, json=body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and says in error["message"], error
    # one problem, not thousands
    assert "constrained-str" not in error["message"] and len(error["message"]) < 300
    assert engine.submitted == []


def test_a_lone_surrogate_is_named_not_the_tokenizers_error(engine, served):
    with client(engine, served) as http:
        for path, body, lone in (
            ("/v1/completions", '{"prompt": "a\\ud800b"}', "'\\ud800'"),
            (
                "/v1/chat/completions",
                '{"messages": [{"role": "user", "content": "\\udc00"}]}',
                "'\\udc00'",
            ),
            # escapes in either case
            ("/v1/completions", '{"prompt": "\\uDBFF"}', "'\\udbff'"),
        ):
            r = http.post(path, content=body)
            assert (
                r.status_code == 400
                and f"lone UTF-16 surrogate ({lone})" in r.json()["error"]["message"]
            ), r.text
        # a pair is one character, and fine
        assert (
            http.post(
                "/v1/completions", content='{"prompt": "\\ud83d\\ude00", "max_tokens": 2}'
            ).status_code
            == 200
        )


# ~290 KB: over what is parsed in place (bodies.IN_PLACE_BYTES)
PAD = "the cat sat on the mat. " * 12_000


@pytest.mark.parametrize(
    "path,body,error",
    [
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 2, "messages": QUESTION, "pad": PAD},
            lambda r: (
                r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
            ),
        ),
        (
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": QUESTION, "pad": PAD},
            lambda r: r.json()["type"] == "error",
        ),
        (
            "/v1/responses",
            {"model": MODEL, "input": "Hi", "pad": PAD},
            lambda r: r.json()["error"]["param"] == "pad",
        ),
        (
            "/api/chat",
            {"model": MODEL, "messages": QUESTION, "pad": PAD},
            lambda r: list(r.json()) == ["error"],
        ),
        (
            "/api/generate",
            {"model": MODEL, "prompt": "Hi", "pad": PAD},
            lambda r: list(r.json()) == ["error"],
        ),
        ("/api/show", {"model": MODEL, "pad": PAD}, lambda r: list(r.json()) == ["error"]),
    ],
)
def test_every_dialects_large_bodies_are_read_in_worker_processes(
    engine, served, path, body, error
):
    before = set(multiprocessing.active_children())
    with client(engine, served) as http:
        r = http.post(path, json=body)
        # the reader pool, started for this body
        workers = set(multiprocessing.active_children()) - before
    assert r.status_code == 400 and error(r), r.text
    message = r.text
    assert "pad: Extra inputs are not permitted" in message and len(message) < 300, message
    assert workers and engine.submitted == []


def test_text_that_cannot_fit_the_context_is_refused_before_tokenizing(engine, served):
    text = "a" * (served.max_prompt_chars + 1)
    with client(engine, served) as http:
        for path, body in (
            ("/v1/completions", {"prompt": text}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}),
        ):
            r = http.post(path, json=body)
            assert (
                r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            ), r.text
    assert engine.submitted == []


def test_the_model_is_retrieved_by_id_with_the_openai_client(engine, served):
    with client(engine, served) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        m = oa.models.retrieve(MODEL)
        assert (m.id, m.object, m.owned_by) == (MODEL, "model", "mlx-ring")
        with pytest.raises(openai.NotFoundError) as e:
            oa.models.retrieve("gpt-4o")
        assert e.value.body["code"] == "model_not_found" and MODEL in e.value.body["message"]


def test_hostile_bodies_do_not_hold_the_event_loop_or_a_running_stream(served):
    """Hostile bodies arrive while a stream runs; a heartbeat task on the app's event loop measures
    the loop's own blocking (how late its 10 ms sleeps wake). The target is 100 ms; the bound
    asserted is 1 s, because on a shared 2-core machine the whole process can lose the CPU for
    hundreds of ms with nothing wrong in it, while a body that holds the loop holds it for seconds
    (a 5 MB body of the wrong shape took 3 s in pydantic alone, 30 s through FastAPI)."""
    engine = FakeEngine(
        served.tokenizer, answer="one two three four five six seven eight nine ten " * 1000
    )
    engine.pace = 0.01
    app = make_app(engine, served)
    late = [0.0]

    async def heartbeat():
        import asyncio

        async def beat():
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                late[0] = max(late[0], time.perf_counter() - t0 - 0.01)

        app.state.heartbeat = asyncio.get_running_loop().create_task(beat())

    app.router.on_startup.append(heartbeat)
    hostile = [
        # 7.5 MB, wrong shape
        ("/v1/chat/completions", json.dumps({"messages": [1] * 2_500_000}).encode(), 400),
        (
            "/v1/chat/completions",
            json.dumps(
                {"messages": [{"role": "user", "content": "hello world " * 1000}] * 1300}
            ).encode(),
            400,
        ),
        # 14 MB of text
        (
            "/v1/completions",
            json.dumps({"prompt": "the cat sat on the mat. " * 600_000}).encode(),
            400,
        ),
        ("/v1/completions", b"[" * 3_000_000, 400),  # nested past any parser's depth
        ("/v1/completions", b"{" + b" " * (17 << 20) + b"}", 413),
    ]
    gaps, statuses, done = [], [], threading.Event()
    with TestClient(app) as http:

        def stream():
            body = {"messages": QUESTION, "stream": True}
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                last = time.perf_counter()
                for _ in r.iter_lines():
                    if done.is_set():
                        break  # the client leaves: the rest is never generated
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

        streamer = threading.Thread(target=stream)
        streamer.start()
        time.sleep(0.2)
        late[0] = 0.0  # from here on: the hostile bodies' time
        for path, body, _ in hostile:
            statuses.append(http.post(path, content=body).status_code)
        worst, running = late[0], streamer.is_alive()
        done.set()
        streamer.join()
    print(
        (
            f"loop held at most {worst:.3f} s, stream gaps at most {max(gaps):.3f} s "
            f"over {len(gaps)} lines"
        )
    )
    assert worst < 1.0, f"the event loop was held for {worst:.2f} s"
    assert statuses == [status for *_, status in hostile]
    assert running and len(gaps) > 50, "the stream ran throughout"
    assert max(gaps) < 1.0 + engine.pace, f"the stream stalled for {max(gaps):.2f} s"


def test_logprobs_join_to_the_text_and_usage_counts_the_end_token(engine, served):
    with client(engine, served) as http:
        oa = openai.OpenAI(
            base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
        )
        r = oa.chat.completions.create(model=MODEL, messages=QUESTION, logprobs=True)
        assert r.choices[0].finish_reason == "stop"
        entries = r.choices[0].logprobs.content  # no entry for <|im_end|>, as in OpenAI's API
        assert (
            "".join(e.token for e in entries) == r.choices[0].message.content
            and len(entries) == r.usage.completion_tokens - 1
        )
        c = oa.completions.create(
            model=MODEL, prompt="The capital of France", logprobs=1, max_tokens=50
        )
        lp = c.choices[0].logprobs
        assert c.choices[0].finish_reason == "stop" and "".join(lp.tokens) == c.choices[0].text
        assert len(lp.tokens) == c.usage.completion_tokens - 1


def test_a_stream_whose_client_leaves_before_its_first_byte_is_cancelled(served):
    """Straight through ASGI, as uvicorn calls the app: the client's disconnect is the message after
    the body, so the response sees it before it first awaits the stream. Starlette then cancels the
    stream's task, but only at its first real wait, which is inside the answer's own loop: its
    clean-up runs and the request is released (a guard: this must stay so)."""
    import asyncio

    engine = FakeEngine(served.tokenizer, answer="word " * 500)
    engine.pace = 0.01
    app = make_app(engine, served)
    body = json.dumps({"messages": QUESTION, "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }

    async def call():
        messages = [
            {"type": "http.request", "body": body, "more_body": False},
            {"type": "http.disconnect"},
        ]

        async def receive():
            return messages.pop(0) if messages else await asyncio.Event().wait()

        async def send(_):
            pass

        await asyncio.wait_for(app(scope, receive, send), 30)

    asyncio.run(call())
    [[req]] = engine.submitted
    assert engine.cancelled == [req] and req.cancelled.is_set()
