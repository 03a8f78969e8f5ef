"""bench_agent.py's pure parts: the replayed session (it grows turn by turn, a billing line of its
own each turn, tool results within their bounds, a body our server accepts), its OpenAI form, and
the report's new-only times and tables."""

import random

from mlx_ring.api.anthropic_request import MessagesRequest
from tools.agent_report import add_new_only, mark_answers, markdown, table
from tools.agent_session import (
    TOOL_RESULT_TOKENS,
    Session,
    capture,
    file_text,
    openai_body,
    pick_tools,
)


def count(text: str) -> int:
    return len(text.split())


def session(turns: int) -> tuple[Session, list[dict]]:
    """A session of `turns` turns, answered in turn with text and with a tool call; its bodies."""
    body = capture()
    s, bodies = Session(body, pick_tools(body["tools"], 3, 0, count), 7, count), []
    for k in range(turns):
        bodies.append(s.body(32))
        call = {"type": "tool_use", "id": f"toolu_{k}", "name": "Read", "input": {"file": "a"}}
        s.advance([{"type": "text", "text": f"answer {k}"}] + ([call] if k % 2 else []))
    return s, bodies


def test_each_turn_extends_the_last_and_carries_a_new_billing_line():
    _, bodies = session(5)
    for last, this in zip(bodies, bodies[1:]):
        assert this["messages"][: len(last["messages"])] == last["messages"]
        assert len(this["messages"]) == len(last["messages"]) + 2
        assert this["system"][1:] == last["system"][1:] == capture()["system"][1:]
    lines = [b["system"][0]["text"] for b in bodies]
    assert all(x.startswith("x-anthropic-billing-header: cc_version=") for x in lines)
    assert len({x.split("cch=")[1] for x in lines}) == 5
    # the server leaves the line out, so every turn's system prompt is the same
    assert len({MessagesRequest.model_validate(b).system_text() for b in bodies}) == 1


def test_a_tool_call_gets_its_result_and_text_gets_the_file_in_a_user_message():
    s, _ = session(2)
    text_turn, call_turn = s.messages[2]["content"], s.messages[4]["content"]
    assert text_turn[0]["type"] == "text" and text_turn[0]["text"].startswith("Here is src/")
    assert call_turn[0] == call_turn[0] | {"type": "tool_result", "tool_use_id": "toolu_1"}
    assert [b["type"] for b in call_turn[1:]] == ["text"]


def test_tool_results_stay_within_their_bounds_and_vary():
    sizes = [
        count(file_text(random.Random(i), random.Random(-i).randint(*TOOL_RESULT_TOKENS), count))
        for i in range(30)
    ]
    assert all(TOOL_RESULT_TOKENS[0] <= n <= TOOL_RESULT_TOKENS[1] for n in sizes)
    assert max(sizes) - min(sizes) > 500
    assert file_text(random.Random(3), 800, count) == file_text(random.Random(3), 800, count)


def test_tools_picked_by_number_or_by_budget():
    tools = capture()["tools"]
    assert [t["name"] for t in pick_tools(tools, 3, 0, count)] == ["Read", "Edit", "Write"]
    assert len(pick_tools(tools, None, 10**9, count)) == len(tools)
    assert [t["name"] for t in pick_tools(tools, None, 0, count)] == ["Read"]


def test_the_openai_body_keeps_the_conversation_without_the_billing_line():
    s, _ = session(2)
    body = s.body(32)
    chat = openai_body(body)
    system = chat["messages"][0]
    assert system == {"role": "system", "content": "".join(b["text"] for b in body["system"][1:])}
    assert "billing" not in system["content"]
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "user"]
    assistant, tool = chat["messages"][4], chat["messages"][5]
    assert assistant["tool_calls"][0]["function"]["name"] == "Read"
    assert (
        tool["tool_call_id"] == "toolu_1"
        and tool["content"] == s.messages[4]["content"][0]["content"]
    )
    assert [t["function"]["name"] for t in chat["tools"]] == [t["name"] for t in body["tools"]]
    assert (chat["max_tokens"], chat["temperature"]) == (32, 0.0)


def turn(k: int, prompt: int, reused: int | None, ttft: float, answer: str = "a") -> dict:
    prefilled = None if reused is None else prompt - reused
    return {"turn": k, "prompt_tokens": prompt, "reused": reused, "prefilled": prefilled} | {
        "ttft_s": ttft,
        "answer": answer,
    }


def run(name: str, turns: list[dict], ours: bool = True) -> dict:
    return {"name": name, "target": "ring, 2 ranks", "ours": ours, "settings": {}, "turns": turns}


def test_new_only_time_is_prefilled_tokens_at_the_cache_off_rate_for_that_length():
    off = run("cache-off", [turn(1, 1000, 0, 2.0), turn(2, 3000, 0, 9.0)])
    on = run("configured", [turn(1, 1000, 0, 2.0), turn(2, 2000, 1900, 0.5, "b")])
    peer = run("mlx_lm", [turn(1, 1000, 0, 4.0), turn(2, 2000, None, 1.0)], ours=False)
    runs = [on, off, peer]
    add_new_only(runs)
    mark_answers(runs)
    # 2000 tokens: halfway between 2 ms and 3 ms a token
    assert abs(on["turns"][1]["new_only_s"] - 100 * 0.0025) < 1e-9
    assert abs(on["turns"][1]["ratio"] - 0.5 / 0.25) < 1e-9
    assert [t["ratio"] for t in off["turns"]] == [1.0, 1.0]
    assert peer["rate_from"] == "its turn 1" and peer["turns"][1]["new_only_s"] is None
    assert [t["same_answer"] for t in on["turns"]] == [True, False]
    assert [t["same_answer"] for t in peer["turns"]] == [None, None]
    lines = table(on)
    assert lines[0] == "### configured (ring, 2 ranks; as configured)"
    assert lines[4] == "| 1 | 1000 | 0 | 1000 | 2.00 | 2.00 | 1.00 |  |"
    assert (
        lines[5] == "| 2 | 2000 | 1900 | 100 | 0.50 | 0.25 | 2.00 | answer differs from cache off |"
    )
    assert table(peer)[5] == "| 2 | 2000 |  |  | 1.00 |  |  |  |"
    assert table(peer)[0] == "### mlx_lm (ring, 2 ranks; its defaults)"
    on["settings"], on["turns"][-1]["prompt_cache"] = (
        {"PROMPT_CACHE_GB": "0.01"},
        {"budget_tokens": 419},
    )
    assert table(on)[0] == (
        "### configured (ring, 2 ranks; PROMPT_CACHE_GB=0.01; a prompt cache of 419 tokens)"
    )
    meta = {"model": "m", "machine": "x", "date": "d", "commit": "c", "argv": [], "tools": 3}
    text = markdown(meta | {"max_tokens": 32}, runs)
    assert "without Claude Code's billing line" in text
    assert "Answers differ from the cache-off run's in: configured." in text
