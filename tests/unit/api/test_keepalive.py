"""Keep-alives while a prompt prefills, in process against the stand-in engine holding its prompts
until the client has seen them: each dialect's own kind, from the moment the request is queued
until the first token or the error, read by the official clients as an unchanged answer."""

import json
import threading

import anthropic
import httpx2
import openai
import pytest
from apiutil import ANSWER, MODEL, client

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
FAST = {"keepalive_s": 0.01}  # keep-alives come often, so the held prompt sees several
COMMENT = b": keep-alive\n\n"
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


class Tap:
    """What an answer's body carried, seen as it comes (before the client reads it): once it has
    carried `marker` `times` times, the engine's held prompt goes on."""

    def __init__(self, hold: threading.Event, marker: bytes, times: int = 1):
        self.hold, self.marker, self.times, self.seen = hold, marker, times, b""

    def __call__(self, piece: bytes) -> None:
        self.seen += piece
        if self.seen.count(self.marker) >= self.times:
            self.hold.set()

    def events(self) -> list[str]:
        return [e for e in self.seen.decode().split("\n\n") if e]


@pytest.fixture
def held(engine):
    engine.hold = threading.Event()
    return engine


class Tapped(httpx2.BaseTransport):
    """Carries each request through the in-process app (its TestClient, streaming), showing
    `tap` each piece of the answer as it comes."""

    def __init__(self, http, tap: Tap):
        self.http, self.tap = http, tap

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        r = self.http.send(request, stream=True)
        return httpx2.Response(
            r.status_code, headers=r.headers.multi_items(), stream=_Body(r, self.tap)
        )


class _Body(httpx2.SyncByteStream):
    def __init__(self, response, tap: Tap):
        self.response, self.tap = response, tap

    def __iter__(self):
        for piece in self.response.iter_raw():
            self.tap(piece)
            yield piece

    def close(self) -> None:
        self.response.close()


def http_client(http, tap: Tap) -> httpx2.Client:
    return httpx2.Client(base_url="http://testserver", transport=Tapped(http, tap))


def openai_sdk(http, tap: Tap) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://testserver/v1",
        api_key="unused",
        max_retries=0,
        http_client=http_client(http, tap),
    )


def anthropic_sdk(http, tap: Tap) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://testserver",
        api_key="unused",
        max_retries=0,
        http_client=http_client(http, tap),
    )


def until_first(events: list[str], first) -> tuple[list[str], list[str]]:
    """`events` split at the first one `first` holds true."""
    at = next(i for i, e in enumerate(events) if first(e))
    return events[:at], events[at:]


def test_chat_completions_send_comments_until_the_first_token(held, served):
    tap = Tap(held.hold, COMMENT)
    with client(held, served, app_args=FAST) as http:
        chunks = list(
            openai_sdk(http, tap).chat.completions.create(
                model=MODEL, messages=QUESTION, stream=True
            )
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    before, after = until_first(tap.events(), lambda e: '"content": "The' in e)
    # the role chunk at once, then only comments until the first token, none after it
    assert before[0].startswith("data: ") and '"role": "assistant"' in before[0]
    assert len(before) > 1 and set(before[1:]) == {": keep-alive"}
    assert all(e.startswith("data: ") for e in after) and after[-1] == "data: [DONE]"


def test_a_failure_during_the_prefill_is_a_chat_error_event(held, served):
    held.fail_after = 0
    tap = Tap(held.hold, COMMENT)
    with client(held, served, app_args=FAST) as http:
        with pytest.raises(openai.APIError, match="a rank stopped"):
            list(
                openai_sdk(http, tap).chat.completions.create(
                    model=MODEL, messages=QUESTION, stream=True
                )
            )
    events = tap.events()
    assert ": keep-alive" in events and events[-1].startswith("data: ")
    error = json.loads(events[-1][6:])["error"]
    assert error["type"] == "service_unavailable" and "a rank stopped" in error["message"]


def test_responses_send_comments_after_in_progress_until_the_first_token(held, served):
    tap = Tap(held.hold, COMMENT)
    with client(held, served, app_args=FAST) as http:
        with openai_sdk(http, tap).responses.stream(model=MODEL, input="Hi") as s:
            types = [e.type for e in s]
            final = s.get_final_response()
    assert final.output_text == ANSWER and final.status == "completed"
    assert types[:2] == ["response.created", "response.in_progress"]
    before, after = until_first(tap.events(), lambda e: "output_item.added" in e)
    assert [e.split("\n")[0] for e in before[:2]] == [
        "event: response.created",
        "event: response.in_progress",
    ]
    assert len(before) > 2 and set(before[2:]) == {": keep-alive"}
    assert ": keep-alive" not in after


def test_a_failure_during_the_prefill_fails_the_response(held, served):
    held.fail_after = 0
    tap = Tap(held.hold, COMMENT)
    with client(held, served, app_args=FAST) as http:
        events = list(openai_sdk(http, tap).responses.create(model=MODEL, input="Hi", stream=True))
    assert events[-1].type == "response.failed"
    assert "a rank stopped" in events[-1].response.error.message
    assert tap.events().count(": keep-alive") >= 1


def names(tap: Tap) -> list[str]:
    return [e.split("\n")[0].removeprefix("event: ") for e in tap.events()]


def test_messages_start_at_once_then_ping_until_the_first_token(held, served):
    held.cached = 9
    with client(held, served, app_args=FAST) as http:
        # the same question without keep-alives: the answer the held one must match
        held.hold.set()
        with anthropic_sdk(http, Tap(held.hold, PING)).messages.stream(
            model=MODEL, max_tokens=100, messages=QUESTION
        ) as s:
            plain = s.get_final_message()
        held.hold = threading.Event()
        tap = Tap(held.hold, PING, times=3)
        events = list(
            anthropic_sdk(http, tap).messages.create(
                model=MODEL, max_tokens=100, messages=QUESTION, stream=True
            )
        )
        with anthropic_sdk(http, Tap(held.hold, PING)).messages.stream(
            model=MODEL, max_tokens=100, messages=QUESTION
        ) as s:
            final = s.get_final_message()
    prompt = len(held.submitted[-1][0].prompt)
    # the SDK skips the pings: the events it gives are those of an answer without them
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    usage = events[0].message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (
        prompt - 9,
        9,
        0,
    )
    before, after = until_first(names(tap), lambda n: n == "content_block_start")
    assert before[0] == "message_start" and set(before[1:]) == {"ping"} and len(before) >= 3
    assert "ping" not in after and after[-1] == "message_stop"
    assert final.model_dump(exclude={"id"}) == plain.model_dump(exclude={"id"})
    assert final.content[0].text == ANSWER


def test_a_prompt_waiting_for_its_turn_starts_the_message_with_the_whole_prompt(held, served):
    held.cached, held.queued = 9, True
    tap = Tap(held.hold, PING, times=2)
    with client(held, served, app_args=FAST) as http:
        with anthropic_sdk(http, tap).messages.stream(
            model=MODEL, max_tokens=100, messages=QUESTION
        ) as s:
            start = next(iter(s))
            final = s.get_final_message()
    prompt = len(held.submitted[-1][0].prompt)
    # its cached start is not known yet: message_delta splits the prompt, as the final usage does
    assert start.type == "message_start"
    assert (start.message.usage.input_tokens, start.message.usage.cache_read_input_tokens) == (
        prompt,
        0,
    )
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (prompt - 9, 9)
    assert final.content[0].text == ANSWER
    before, _ = until_first(names(tap), lambda n: n == "content_block_start")
    assert before[0] == "message_start" and set(before[1:]) == {"ping"} and len(before) >= 3


def test_a_failure_during_the_prefill_is_an_anthropic_error_event(held, served):
    held.fail_after = 0
    tap = Tap(held.hold, PING, times=2)
    with client(held, served, app_args=FAST) as http:
        with pytest.raises(anthropic.APIStatusError, match="a rank stopped"):
            list(
                anthropic_sdk(http, tap).messages.create(
                    model=MODEL, max_tokens=100, messages=QUESTION, stream=True
                )
            )
    kinds = names(tap)
    assert kinds[0] == "message_start" and kinds[-1] == "error" and "ping" in kinds
    assert json.loads(tap.events()[-1].split("data: ", 1)[1])["error"]["type"] == (
        "overloaded_error"
    )


def test_ollama_streams_carry_only_ollamas_lines_while_a_prompt_prefills(held, served):
    # Ollama's protocol has no keep-alive its clients skip: its stream waits, as Ollama's does.
    # Held until a chat completion queued after it has sent keep-alives: by then the Ollama
    # stream has waited as long.
    lines = []
    with client(held, served, app_args=FAST) as http:

        def ollama_chat():
            body = {"model": MODEL, "messages": QUESTION, "stream": True}
            with http.stream("POST", "/api/chat", json=body) as r:
                lines.extend(r.iter_lines())

        asking = threading.Thread(target=ollama_chat)
        asking.start()
        while not held.submitted:
            held.hold.wait(0.01)
        tap = Tap(held.hold, COMMENT, times=3)
        list(
            openai_sdk(http, tap).chat.completions.create(
                model=MODEL, messages=QUESTION, stream=True
            )
        )
        asking.join(60)
    answer = [json.loads(line) for line in lines]
    assert "".join(a["message"]["content"] for a in answer) == ANSWER
    assert [a["done"] for a in answer] == [False] * (len(answer) - 1) + [True]


def test_a_client_that_leaves_during_the_prefill_cancels_its_request(held, served):
    body = {"model": MODEL, "messages": QUESTION, "stream": True}
    with client(held, served, app_args=FAST) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert ": keep-alive" in r.iter_lines()  # read until the first one, then hang up
        for _ in range(1000):  # the request's cleanup runs on the app's loop
            if held.cancelled:
                break
            held.hold.wait(0.01)
        assert held.cancelled == held.submitted[0]
    held.hold.set()  # the stand-in's answer, on its own thread, sees the client gone
