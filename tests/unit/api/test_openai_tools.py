"""Tool calls through the OpenAI API in process, under a chat template with tools: a call
in OpenAI's shape whole and streamed, a named tool forced by a grammar, and a tool's
result reaching the template."""

from apiutil import ANSWER, CALL, MODEL, FakeEngine, client
from openaiutil import QUESTION, TOOLS, events


def test_a_tool_call_in_openai_shape_whole_and_streamed(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS}
    with client(engine, tool_served) as http:
        whole = http.post("/v1/chat/completions", json=ask).json()
        streamed = events(http.post("/v1/chat/completions", json=dict(ask, stream=True)))
    [choice] = whole["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert engine.submitted[0][0].params.grammar is None  # "auto": the model may answer in text
    deltas = [c["choices"][0]["delta"] for c in streamed[:-1]]
    # the id and name, then the arguments as they come
    [head, *rest] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert head == [
        {
            "index": 0,
            "id": head[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
    ]
    assert len(rest) > 1 and all(
        [c] == [{"index": 0, "function": {"arguments": c["function"]["arguments"]}}] for [c] in rest
    )
    assert "".join(c["function"]["arguments"] for [c] in rest) == call["function"]["arguments"]
    assert "".join(d.get("content") or "" for d in deltas) == ""  # the call's text is not content
    assert [
        c["choices"][0]["finish_reason"] for c in streamed[:-1] if c["choices"][0]["finish_reason"]
    ] == ["tool_calls"]


def test_a_named_tool_is_forced_by_a_grammar(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=CALL)
    with client(engine, tool_served) as http:
        r = http.post(
            "/v1/chat/completions",
            json={
                "messages": QUESTION,
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
        )
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls"
        grammar = engine.submitted[0][0].params.grammar
        assert grammar is not None and "get_weather" in grammar
        r = http.post(
            "/v1/chat/completions",
            json={"messages": QUESTION, "tools": TOOLS, "tool_choice": "none"},
        )
    assert engine.submitted[1][0].params.grammar is None
    # none: no tools offered
    assert "get_weather" not in tool_served.tokenizer.decode(engine.submitted[1][0].prompt)


def test_a_tool_result_turn_reaches_the_template(tool_served):
    engine = FakeEngine(tool_served.tokenizer)
    turns = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    with client(engine, tool_served) as http:
        r = http.post("/v1/chat/completions", json={"messages": turns, "tools": TOOLS})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ANSWER
    prompt = tool_served.tokenizer.decode(engine.submitted[0][0].prompt)
    want = tool_served.tokenizer.apply_chat_template(
        [
            QUESTION[0],
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
        ],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert (
        prompt == want
        and '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        and "21 degrees and sunny" in prompt
    )
