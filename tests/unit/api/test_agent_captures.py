"""The first request of Codex 0.171 (`codex exec`) and Claude Code 2.1 (`claude -p`), as a local
HTTP server received them from the real clients (tests/data/clients/), replayed in process: each
is answered with what the client reads back. Claude Code's names its own model (`claude-...`:
MODEL_ALIASES answers to it) and its prompt is more than the default model's 8k context, which
answers a context error."""

import copy
import json
from pathlib import Path

from apiutil import FakeEngine, client
from llguidance import LLMatcher

DATA = Path(__file__).parents[2] / "data" / "clients"
SPAWN = (
    '<tool_call>\n{"name": "multi_agent_v1__spawn_agent", "arguments": {"message": '
    '"look"}}\n</tool_call>'
)


def captured(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]


def test_codex_as_it_sends_namespace_tools_and_web_search(tool_served):
    sent = captured("codex_0.171_responses.json")
    kinds = [t["type"] for t in sent["body"]["tools"]]
    # what the capture holds, and the test is about
    assert "namespace" in kinds and "web_search" in kinds
    engine = FakeEngine(tool_served.tokenizer, answer=SPAWN)
    with client(engine, tool_served, context_length=131072) as http:
        r = http.post(sent["path"], json=sent["body"], headers=sent["headers"])
        assert r.status_code == 200, r.text
        out = events(r.text)
        done = out[-1]["response"]
        assert done["status"] == "completed"
        [call] = done["output"]
        # the model saw the namespaced function under one flat name; Codex reads
        # name and namespace apart
        assert (call["type"], call["name"], call["namespace"], json.loads(call["arguments"])) == (
            "function_call",
            "spawn_agent",
            "multi_agent_v1",
            {"message": "look"},
        )
        added = [e["item"] for e in out if e["type"] == "response.output_item.added"]
        assert added[0]["namespace"] == "multi_agent_v1"
        prompt = tool_served.tokenizer.decode(engine.submitted[0][0].prompt)
        assert "multi_agent_v1__spawn_agent" in prompt and "exec_command" in prompt
        assert "web_search" not in prompt  # a hosted tool this server does not run is not offered
        # the next turn carries the call back with its namespace, and its output
        turn = sent["body"] | {
            "input": sent["body"]["input"]
            + [
                {
                    "type": "function_call",
                    "name": "spawn_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": call["arguments"],
                    "call_id": call["call_id"],
                },
                {"type": "function_call_output", "call_id": call["call_id"], "output": "agent-1"},
            ]
        }
        engine.answer = "Spawned."
        r = http.post(sent["path"], json=turn, headers=sent["headers"])
        assert r.status_code == 200, r.text
        assert events(r.text)[-1]["response"]["output"][0]["content"][0]["text"] == "Spawned."
        assert "multi_agent_v1__spawn_agent" in tool_served.tokenizer.decode(
            engine.submitted[1][0].prompt
        )
        # hosted tools it cannot stand in for are still refused by name
        other = sent["body"] | {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}
        r = http.post(sent["path"], json=other, headers=sent["headers"])
        assert (
            r.status_code == 400
            and "tools.0: file_search tools are not supported" in r.json()["error"]["message"]
        )


def test_claude_code_as_it_sends_context_management_and_effort(tool_served):
    sent = captured("claude_code_2.1_messages.json")
    body = sent["body"]
    assert (
        body["context_management"]["edits"][0]["type"].startswith("clear_thinking_")
        and body["max_tokens"] == 64000
    )
    engine = FakeEngine(tool_served.tokenizer, answer="Hello!")
    with client(engine, tool_served, context_length=131072, aliases=("claude-*",)) as http:
        r = http.post(sent["path"], json=body, headers=sent["headers"])
        assert r.status_code == 200, r.text
        out = events(r.text)
        assert (
            "".join(e["delta"].get("text", "") for e in out if e["type"] == "content_block_delta")
            == "Hello!"
        )
        assert [e["delta"]["stop_reason"] for e in out if e["type"] == "message_delta"] == [
            "end_turn"
        ]
        # 64000 asked: cut to the room the prompt leaves
        [[req]] = engine.submitted
        assert (
            req.max_tokens == min(64000, 131072 - len(req.prompt))
            and len(req.prompt) > tool_served.context_length
        )
        # editing that would change what the model reads is refused by name
        edits = body | {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}
        r = http.post(sent["path"], json=edits, headers=sent["headers"])
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(
            "context_management: not supported"
        ), r.text
    # the model's own 8k context
    with client(FakeEngine(tool_served.tokenizer), tool_served, aliases=("claude-*",)) as http:
        r = http.post(sent["path"], json=body, headers=sent["headers"])
    assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text


def test_codex_with_an_openai_model_name_sends_custom_and_tool_search_tools(tool_served):
    sent = captured("codex_0.171_gpt55_responses.json")
    body = sent["body"]
    tools = {t["type"]: t for t in body["tools"]}
    assert (
        body["model"] == "gpt-5.5"
        and tools["custom"]["format"]["syntax"] == "lark"
        and tools["tool_search"]["execution"] == "client"
    )
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
    engine = FakeEngine(
        tool_served.tokenizer,
        answer=(
            "<tool_call>\n"
            f"{json.dumps({'name': 'apply_patch', 'arguments': {'input': patch}})}"
            "\n</tool_call>"
        ),
    )
    with client(engine, tool_served, context_length=131072, aliases=("gpt-*",)) as http:
        r = http.post(sent["path"], json=body, headers=sent["headers"])
        assert r.status_code == 200, r.text
        out = events(r.text)
        [call] = out[-1]["response"]["output"]
        assert (call["type"], call["name"], call["input"]) == (
            "custom_tool_call",
            "apply_patch",
            patch,
        )
        assert (
            "".join(e["delta"] for e in out if e["type"] == "response.custom_tool_call_input.delta")
            == patch
        )
        prompt = tool_served.tokenizer.decode(engine.submitted[0][0].prompt)
        assert (
            '"name": "apply_patch"' in prompt
            and '"name": "tool_search"' in prompt
            and "web_search" not in prompt
        )
        # tool_choice auto: the answer is free, and an apply_patch call in it holds
        # to the patch grammar
        matcher = LLMatcher(
            tool_served.grammars.tokenizer, engine.submitted[0][0].params.grammar, log_level=0
        )
        assert all(
            matcher.consume_token(t)
            for t in tool_served.tokenizer.encode(engine.answer, add_special_tokens=False)
        )
        # Codex's next turn: the call and its output
        turn = body | {
            "input": body["input"]
            + [
                {
                    "type": "custom_tool_call",
                    "call_id": call["call_id"],
                    "name": "apply_patch",
                    "input": patch,
                },
                {
                    "type": "custom_tool_call_output",
                    "call_id": call["call_id"],
                    "output": "Success. Updated the following files:\nA hello.txt",
                },
            ]
        }
        engine.answer = "Created hello.txt."
        r = http.post(sent["path"], json=turn, headers=sent["headers"])
        assert r.status_code == 200, r.text
        assert (
            events(r.text)[-1]["response"]["output"][0]["content"][0]["text"]
            == "Created hello.txt."
        )
        assert "A hello.txt" in tool_served.tokenizer.decode(engine.submitted[1][0].prompt)


def test_claude_codes_billing_line_stays_out_of_the_prompt_so_turns_share_their_prefix(
    tool_served,
):
    sent = captured("claude_code_2.1_messages.json")
    first = sent["body"]["system"][0]["text"]
    assert first.startswith("x-anthropic-billing-header: cc_version=")
    engine = FakeEngine(tool_served.tokenizer, answer="Hello!")
    with client(engine, tool_served, context_length=131072, aliases=("claude-*",)) as http:
        for cch in ("", " cch=1f2e3;", " cch=9a8b7;"):
            body = copy.deepcopy(sent["body"])
            body["system"][0]["text"] = first + cch
            r = http.post(sent["path"], json=body, headers=sent["headers"])
            assert r.status_code == 200, r.text
    prompts = [req.prompt for [req] in engine.submitted]
    assert prompts[0] == prompts[1] == prompts[2]
    text = tool_served.tokenizer.decode(prompts[0])
    assert "x-anthropic-billing-header" not in text and "cc_version" not in text
    assert "You are a Claude agent, built on Anthropic's Claude Agent SDK." in text
