"""An answer sent back in a later turn's history renders as the model wrote it (produced.py): its
calls' spacing and key order, and the text around them, so the next prompt starts with the last
prompt and the answer's own tokens. In process, under a chat template with tools."""

from functools import partial

from apiutil import MODEL, FakeEngine, client, templated
from openaiutil import QUESTION, TOOLS

from mlx_ring.api.produced import ProducedTurns, Written, as_written, splice

# Written as a model may write it: no spaces, the keys not in the schema's order.
WRITTEN = (
    "Let me look.\n<tool_call>\n"
    '{"name":"get_weather","arguments":{"unit":"celsius","city":"Paris"}}\n</tool_call>'
)


def test_an_answer_is_found_by_its_text_and_its_calls_as_json_values():
    turns = ProducedTurns()
    call = {"function": {"name": "f", "arguments": '{"b": 1, "a": [1, 2]}'}}
    raw = Written("raw text", (1, 2))
    turns.remember("Hi.\n", [call], raw)
    assert turns.recall("  Hi.", [("f", '{"a":[1,2],"b":1}')]) == raw
    assert turns.recall("Hi.", [("f", '{"a": [2, 1], "b": 1}')]) is None
    assert turns.recall("Hi.", [("g", '{"a": [1, 2], "b": 1}')]) is None
    assert turns.recall("Hi!", [("f", '{"a": [1, 2], "b": 1}')]) is None
    assert turns.recall("Hi.", []) is None


def test_the_least_recently_used_answers_go_first():
    turns = ProducedTurns(max_chars=10)
    a, b, c = (Written(x * 3, (1,)) for x in "abc")
    turns.remember("a", [], a)
    turns.remember("b", [], b)
    assert turns.recall("a", []) == a  # now the most recent
    turns.remember("c", [], c)
    assert (turns.recall("a", []), turns.recall("b", []), turns.recall("c", [])) == (a, None, c)
    turns.remember("d", [], Written("x" * 11, None))  # more than the whole budget: not kept
    assert turns.recall("d", []) is None and len(turns) == 2


def test_an_answer_keeps_the_ids_it_was_written_with(tool_served):
    tok = tool_served.tokenizer
    # "Paris" in two tokens, as a grammar may make a model write it
    ids = tok.encode("city: ", add_special_tokens=False) + [tok.encode("Pa")[-1], 285]
    text = tok.decode(ids)
    assert tok.encode(text, add_special_tokens=False) != ids
    assert as_written(text, ids + [tok.eos_token_id], tok.decode) == Written(text, tuple(ids))
    assert as_written(text + "!", ids, tok.decode) == Written(text + "!", None)
    rendered = f"<|im_start|>assistant\n{text}<|im_end|>\n"
    encode = partial(tok.encode, add_special_tokens=False)
    assert splice(rendered, [Written(text, tuple(ids))], encode) == (
        encode("<|im_start|>assistant\n") + ids + encode("<|im_end|>\n")
    )
    # not found as written (a template may change a turn's text): all of it tokenized
    assert splice(rendered, [Written("elsewhere", (1,))], encode) == encode(rendered)


def answer_then_turn(tool_served, sent_args, answer=WRITTEN, **first):
    """(The second prompt, the first, the answer's message) after `answer`, sent back with its
    call's arguments changed by `sent_args`."""
    engine = FakeEngine(tool_served.tokenizer, answer=answer)
    ask = {"model": MODEL, "messages": QUESTION, "tools": TOOLS, **first}
    with client(engine, tool_served) as http:
        message = http.post("/v1/chat/completions", json=ask).json()["choices"][0]["message"]
        [call] = message["tool_calls"]  # `first` may leave a second call out
        call["function"]["arguments"] = sent_args(call["function"]["arguments"])
        turn = [
            *QUESTION,
            message,
            {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"},
        ]
        engine.answer = "It is sunny."
        assert http.post("/v1/chat/completions", json=dict(ask, messages=turn)).status_code == 200
    return engine.submitted[1][0].prompt, engine.submitted[0][0].prompt, message


def test_a_call_sent_back_renders_as_written(tool_served):
    second, first, message = answer_then_turn(
        tool_served, lambda a: a.replace('"city"', ' "city" ')
    )
    assert message["content"] == "Let me look."
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    written = [*QUESTION, {"role": "assistant", "content": WRITTEN}]
    tok = tool_served.tokenizer
    assert second[: len(first)] == first
    # the answer's own tokens follow the first prompt
    answer = tok.encode(WRITTEN, add_special_tokens=False)
    assert second[len(first) : len(first) + len(answer)] == answer
    assert (
        second[: len(first) + len(answer)]
        == templated(tool_served, written, tools=TOOLS)[: len(first) + len(answer)]
    )


def sent_back(message: dict, args: dict) -> list[dict]:
    """The turn that sends back `message`'s call, its arguments `args`, as a template takes it."""
    call = message["tool_calls"][0]
    assistant = {
        "role": "assistant",
        "content": message["content"],
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": args},
            }
        ],
    }
    tool = {"role": "tool", "tool_call_id": call["id"], "content": "Sunny"}
    return [*QUESTION, assistant, tool]


def test_a_changed_call_renders_through_the_template(tool_served):
    second, _, message = answer_then_turn(tool_served, lambda a: a.replace("Paris", "Lyon"))
    lyon = sent_back(message, {"unit": "celsius", "city": "Lyon"})
    assert second == templated(tool_served, lyon, tools=TOOLS)


def test_an_answer_with_a_call_left_out_renders_through_the_template(tool_served):
    # parallel_tool_calls false: the client never sees the second call, so the text the model
    # wrote is not what it was shown
    two = WRITTEN + '\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    second, _, message = answer_then_turn(
        tool_served, lambda a: a, answer=two, parallel_tool_calls=False
    )
    paris = sent_back(message, {"unit": "celsius", "city": "Paris"})
    assert second == templated(tool_served, paris, tools=TOOLS)
