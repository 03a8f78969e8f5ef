"""Claude Code's own requests, replayed in process against the stand-in engine: its Messages
body with its headers (`?beta=true`, `anthropic-beta`, `x-api-key`, `max_tokens: 32000`, cached
system blocks, `thinking`, `metadata.user_id`). Each must answer as the same conversation does
through chat completions."""

import copy
import json

from agentutil import KEY, agent_client, events
from apiutil import MODEL, FakeEngine

BASH_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'

# Claude Code: POST /v1/messages?beta=true through the SDK's beta client, as it sends a turn.
CLAUDE_HEADERS = {
    "x-api-key": KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": (
        "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"
    ),
    "anthropic-dangerous-direct-browser-access": "true",
    "x-app": "cli",
    "user-agent": "claude-cli/2.0.14 (external, cli)",
}
BASH = {
    "name": "Bash",
    "description": "Executes a given bash command in a persistent shell session.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {
                "type": "number",
                "description": "Optional timeout in milliseconds (max 600000)",
            },
            "description": {
                "type": "string",
                "description": "Clear, concise description of what this command does",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
}
REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following "
    "context.\n</system-reminder>"
)
CLAUDE = {
    "model": MODEL,
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": REMINDER},
                {
                    "type": "text",
                    "text": "List the files here.",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        }
    ],
    "temperature": 1,
    "system": [
        {
            "type": "text",
            "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"},
        },
        {
            "type": "text",
            "text": (
                "\nYou are an interactive CLI tool that helps users with "
                "software engineering tasks."
            ),
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "tools": [BASH],
    "metadata": {
        "user_id": "user_" + "ab" * 32 + "_account__session_0199a1f2-2222-7000-8000-000000000002"
    },
    "max_tokens": 32000,
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "stream": True,
}


def test_claude_code_turns_as_claude_code_sends_them(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=BASH_CALL)
    with agent_client(engine, tool_served) as http:
        r = http.post("/v1/messages?beta=true", json=CLAUDE, headers=CLAUDE_HEADERS)
        assert r.status_code == 200, r.text
        sent = events(r.text)
        assert not any(
            e["type"] == "content_block_start" and e["content_block"]["type"] == "thinking"
            for e in sent
        )
        [use] = [e["content_block"] for e in sent if e["type"] == "content_block_start"]
        assert (use["type"], use["name"]) == ("tool_use", "Bash")
        assert [e["delta"]["stop_reason"] for e in sent if e["type"] == "message_delta"] == [
            "tool_use"
        ]
        [[req]] = engine.submitted
        # 32000 asked: the room left
        assert req.max_tokens == tool_served.context_length - len(req.prompt)
        engine.answer = "README.md and src."
        turn = copy.deepcopy(CLAUDE)
        turn["messages"] += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": use["id"],
                        "name": "Bash",
                        "input": {"command": "ls"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": use["id"],
                        "content": [{"type": "text", "text": "README.md\nsrc"}],
                    }
                ],
            },
        ]
        r = http.post("/v1/messages?beta=true", json=turn, headers=CLAUDE_HEADERS)
        assert r.status_code == 200, r.text
        assert (
            "".join(
                e["delta"].get("text", "")
                for e in events(r.text)
                if e["type"] == "content_block_delta"
            )
            == "README.md and src."
        )
        # the same conversation through chat completions gets the same prompt
        system = "".join(b["text"] for b in CLAUDE["system"])
        chat = [
            {"role": "system", "content": system},
            {"role": "user", "content": REMINDER + "List the files here."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": use["id"],
                        "type": "function",
                        "function": {"name": "Bash", "arguments": json.dumps({"command": "ls"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": use["id"], "content": "README.md\nsrc"},
        ]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": BASH["description"],
                    "parameters": BASH["input_schema"],
                },
            }
        ]
        r = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": chat, "tools": tools},
            headers={"authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 200, r.text
    assert engine.submitted[1][0].prompt == engine.submitted[2][0].prompt


def test_claude_code_without_thinking_and_with_a_top_level_cache_control(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer="Hello.")
    with agent_client(engine, tool_served) as http:
        body = CLAUDE | {
            "thinking": {"type": "disabled"},
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
            "stream": False,
        }
        r = http.post("/v1/messages?beta=true", json=body, headers=CLAUDE_HEADERS)
        counted = http.post(
            "/v1/messages/count_tokens?beta=true",
            headers=CLAUDE_HEADERS,
            json={k: CLAUDE[k] for k in ("model", "messages", "system", "tools", "thinking")},
        )
    assert r.status_code == 200, r.text
    m = r.json()
    assert ([b["type"] for b in m["content"]], m["content"][0]["text"], m["stop_reason"]) == (
        ["text"],
        "Hello.",
        "end_turn",
    )
    assert counted.json() == {"input_tokens": len(engine.submitted[0][0].prompt)}


def test_claude_code_reading_an_image_gets_a_clear_refusal(tool_served):
    """Claude Code's Read tool returns an image as an image block inside the tool_result."""
    engine = FakeEngine(tool_served.tokenizer)
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    turn = copy.deepcopy(CLAUDE) | {"stream": False}
    turn["messages"] += [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Read",
                    "input": {"file_path": "/tmp/a.png"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "The image:"}, image],
                }
            ],
        },
    ]
    with agent_client(engine, tool_served) as http:
        r = http.post("/v1/messages?beta=true", json=turn, headers=CLAUDE_HEADERS)
    assert r.status_code == 400 and not engine.submitted
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": (
                "messages.2.content.0.content.1: image blocks are not supported by this text "
                "model; send text blocks"
            ),
        },
    }
