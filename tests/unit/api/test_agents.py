"""Coding agents' own requests, replayed in process against the stand-in engine: Codex's
Responses body (as codex-rs serializes its ResponsesApiRequest: `reasoning` always present, null
for a model without reasoning, `store: false`, `include`, `prompt_cache_key`, function tools with
`strict: false`) and Claude Code's Messages body with its headers (`?beta=true`,
`anthropic-beta`, `x-api-key`, `max_tokens: 32000`, cached system blocks, `thinking`,
`metadata.user_id`). Each must answer as the same conversation does through chat completions."""

import copy
import json

from apiutil import MODEL, FakeEngine, client

from mlx_ring.api.keys import Key

KEY = "sk-agent-1"
SHELL_CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"]}}\n</tool_call>'
BASH_CALL = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'

# codex-rs: ResponsesApiRequest as its Serialize impl writes it for a model without reasoning.
CODEX_HEADERS = {
    "authorization": f"Bearer {KEY}",
    "openai-beta": "responses=experimental",
    "originator": "codex_cli_rs",
    "session_id": "0199a1f2-1111-7000-8000-000000000001",
    "accept": "text/event-stream",
    "user-agent": "codex_cli_rs/0.46.0 (Mac OS 15.0.0; arm64) iTerm.app/3.5.0",
}
CODEX_TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command and returns its output.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "command": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The command to execute",
                },
                "workdir": {
                    "type": "string",
                    "description": "The working directory to execute the command in",
                },
                "timeout_ms": {
                    "type": "number",
                    "description": "The timeout for the command in milliseconds",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "update_plan",
        "description": "Updates the task plan.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                "explanation": {"type": "string"},
                "plan": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string"},
                            "status": {
                                "type": "string",
                                "description": "One of: pending, in_progress, completed",
                            },
                        },
                        "required": ["step", "status"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["plan"],
            "additionalProperties": False,
        },
    },
]
ENVIRONMENT = (
    "<environment_context>\n  <cwd>/Users/me/project</cwd>\n  "
    "<shell>zsh</shell>\n</environment_context>"
)
CODEX = {
    "model": MODEL,
    "instructions": (
        "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI "
        "on a user's computer."
    ),
    "input": [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": ENVIRONMENT}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "List the files here."}],
        },
    ],
    "tools": CODEX_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": None,
    "store": False,
    "stream": True,
    "include": [],
    "prompt_cache_key": "0199a1f2-1111-7000-8000-000000000001",
}

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


def events(text: str) -> list[dict]:
    """A named-event SSE body's data objects, in order."""
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]


def agent_client(engine, served):
    return client(engine, served, [Key("agent", f"Bearer {KEY}".encode())])


def test_codex_turns_as_codex_sends_them(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer=SHELL_CALL)
    with agent_client(engine, tool_served) as http:
        r = http.post("/v1/responses", json=CODEX, headers=CODEX_HEADERS)
        assert r.status_code == 200, r.text
        done = events(r.text)[-1]
        assert done["type"] == "response.completed"
        [call] = done["response"]["output"]
        assert (call["type"], call["name"], json.loads(call["arguments"])) == (
            "function_call",
            "shell",
            {"command": ["ls"]},
        )
        # the next turn: the call and its output appended to the input, as Codex keeps its history
        # (store: false)
        engine.answer = "Two files: README.md and src."
        turn = copy.deepcopy(CODEX)
        turn["input"] += [
            {
                "type": "function_call",
                "name": "shell",
                "arguments": call["arguments"],
                "call_id": call["call_id"],
            },
            {
                "type": "function_call_output",
                "call_id": call["call_id"],
                "output": "README.md\nsrc",
            },
        ]
        r = http.post("/v1/responses", json=turn, headers=CODEX_HEADERS)
        assert r.status_code == 200, r.text
        assert (
            events(r.text)[-1]["response"]["output"][0]["content"][0]["text"]
            == "Two files: README.md and src."
        )
        # the same conversation through chat completions gets the same prompt
        chat = [
            {"role": "system", "content": CODEX["instructions"]},
            {"role": "user", "content": ENVIRONMENT},
            {"role": "user", "content": "List the files here."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call["call_id"],
                        "type": "function",
                        "function": {"name": "shell", "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["call_id"], "content": "README.md\nsrc"},
        ]
        tools = [
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in CODEX_TOOLS
        ]
        r = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": chat, "tools": tools},
            headers=CODEX_HEADERS,
        )
        assert r.status_code == 200, r.text
    assert engine.submitted[1][0].prompt == engine.submitted[2][0].prompt


def test_codex_with_a_reasoning_effort_gets_the_same_answer(tool_served):
    engine = FakeEngine(tool_served.tokenizer, answer="Done.")
    with agent_client(engine, tool_served) as http:
        plain = http.post("/v1/responses", json=CODEX, headers=CODEX_HEADERS)
        reasoning = CODEX | {
            "reasoning": {"effort": "medium", "summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "text": {"verbosity": "medium"},
            "client_metadata": {"x-codex-installation-id": "abc"},
        }
        asked = http.post("/v1/responses", json=reasoning, headers=CODEX_HEADERS)
    assert (plain.status_code, asked.status_code) == (200, 200), asked.text
    assert engine.submitted[0][0].prompt == engine.submitted[1][0].prompt
    assert events(asked.text)[-1]["response"]["output"][0]["content"][0]["text"] == "Done."


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
