"""The sampling bounds are held once, by the internal request, and checked where a dialect builds it
(dialects.chat_request): a value out of bounds through any dialect is a 400 in that dialect's error
shape naming the client's own field, never a 422, and nothing reaches the engine; /openapi.json
shows the same bounds on every dialect's field."""

import pytest
from apiutil import MODEL, client

from mlx_ring.api.anthropic_request import MessagesRequest
from mlx_ring.api.dialects import chat_request
from mlx_ring.api.errors import ApiError
from mlx_ring.api.ollama import NAMES, OPTIONS, Options
from mlx_ring.api.openai_request import ChatCompletionRequest
from mlx_ring.api.responses_request import ResponsesRequest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHAT = {"model": MODEL, "messages": QUESTION, "stream": False}
GENERATE = {"model": MODEL, "prompt": "The capital of France is", "stream": False}
MESSAGES = {"model": MODEL, "max_tokens": 9, "messages": QUESTION}
RESPONSES = {"model": MODEL, "input": "Hi"}


def chat(**options) -> dict:
    return CHAT | {"options": options}


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/api/chat", chat(temperature=5), "options.temperature"),
        ("/api/chat", chat(top_p=1.5), "options.top_p"),
        ("/api/chat", chat(top_k=-1), "options.top_k"),
        ("/api/chat", chat(min_p=-0.5), "options.min_p"),
        ("/api/chat", chat(repeat_penalty=0), "options.repeat_penalty"),
        ("/api/chat", chat(presence_penalty=3), "options.presence_penalty"),
        ("/api/chat", chat(frequency_penalty=-3), "options.frequency_penalty"),
        ("/api/chat", chat(seed=-(1 << 63) - 1), "options.seed"),
        ("/api/chat", chat(temperature=5) | {"messages": []}, "options.temperature"),  # a load only
        ("/api/generate", GENERATE | {"options": {"stop": list("abcde")}}, "options.stop"),
        ("/api/generate", GENERATE | {"raw": True, "options": {"top_p": -1}}, "options.top_p"),
        ("/api/generate", GENERATE | {"prompt": "", "options": {"min_p": 2}}, "options.min_p"),
        ("/v1/messages", MESSAGES | {"max_tokens": 0}, "max_tokens"),
        ("/v1/messages", MESSAGES | {"top_p": 1.5}, "top_p"),
        ("/v1/messages", MESSAGES | {"top_k": -2}, "top_k"),
        ("/v1/messages", MESSAGES | {"stop_sequences": list("abcde")}, "stop_sequences"),
        ("/v1/messages", MESSAGES | {"temperature": 1.5}, "temperature"),  # Anthropic's own bound
        ("/v1/responses", RESPONSES | {"max_output_tokens": 0}, "max_output_tokens"),
        ("/v1/responses", RESPONSES | {"temperature": 2.5}, "temperature"),
        ("/v1/responses", RESPONSES | {"top_p": -0.1}, "top_p"),
    ],
)
def test_a_bound_broken_through_a_dialect_is_a_400_naming_the_clients_field(
    engine, served, path, body, field
):
    with client(engine, served) as http:
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path.startswith("/api/"):  # Ollama's {"error": message}
        assert list(r.json()) == ["error"]
        message = error
    elif path.startswith("/v1/messages"):  # Anthropic's
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
        message = error["message"]
    else:  # OpenAI's, with the field as its param
        assert error["param"] == field
        message = error["message"]
    says = "List should have at most 4" if "stop" in field else "Input should be"
    assert message.startswith(f"{field}: {says}"), message
    assert engine.submitted == []


def test_the_bounds_are_the_internal_requests_alone():
    """A dialect's model takes what the internal request refuses: no bound is copied into it; the
    internal request's construction refuses the value, in the client's words."""
    assert Options.model_validate({"temperature": 5, "seed": 1 << 63}).temperature == 5
    assert MessagesRequest.model_validate(MESSAGES | {"max_tokens": 0, "top_k": -1}).max_tokens == 0
    assert ResponsesRequest.model_validate(RESPONSES | {"top_p": 7.0}).top_p == 7.0
    with pytest.raises(ApiError) as e:
        chat_request({"model": MODEL, "messages": QUESTION, "seed": 1 << 63}, names=NAMES)
    assert (e.value.status, e.value.param) == (400, "options")
    assert e.value.message.startswith("options.seed: Input should be less than or equal to 9223372")
    with pytest.raises(
        ApiError,
        match=r"^stop: List should have at most 4 stop strings; this "
        r"request has 5$",
    ):
        chat_request({"messages": QUESTION, "stop": list("abcde")})
    fields = {"messages": QUESTION, "temperature": 0, "top_k": 5, "stop": ["x"]}
    request = chat_request(fields, names=NAMES)
    assert isinstance(request, ChatCompletionRequest)
    assert (request.temperature, request.top_k, request.stop, request.top_p) == (0, 5, ["x"], 1.0)


def test_the_openapi_document_shows_the_internal_bounds_on_every_dialects_field(engine, served):
    with client(engine, served) as http:
        schemas = http.get("/openapi.json").json()["components"]["schemas"]

    def bounds(schema: dict) -> dict:
        keys = ("minimum", "maximum", "maxItems")
        return {k: v for b in schema.get("anyOf", [schema]) for k, v in b.items() if k in keys}

    internal = schemas["ChatCompletionRequest"]["properties"]
    pairs = [("Options", theirs, ours) for theirs, ours in OPTIONS.items()] + [
        ("MessagesRequest", "max_tokens", "max_tokens"),
        ("MessagesRequest", "top_p", "top_p"),
        ("MessagesRequest", "stop_sequences", "stop"),
        ("MessagesRequest", "top_k", "top_k"),
        ("ResponsesRequest", "max_output_tokens", "max_tokens"),
        ("ResponsesRequest", "temperature", "temperature"),
        ("ResponsesRequest", "top_p", "top_p"),
    ]
    for model, theirs, ours in pairs:
        want = bounds(internal[ours])
        if ours == "max_tokens":  # chat's run-time limit: the dialects cut to the context instead
            want.pop("maximum")
        assert want and bounds(schemas[model]["properties"][theirs]) == want, (model, theirs)
