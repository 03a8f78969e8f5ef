"""Codex's own requests, replayed in process against the stand-in engine: its Responses body (as
codex-rs serializes its ResponsesApiRequest: `reasoning` always present, null for a model without
reasoning, `store: false`, `include`, `prompt_cache_key`, function tools with `strict: false`).
Each must answer as the same conversation does through chat completions."""

import copy
import json

from agentutil import KEY, agent_client, events
from apiutil import MODEL, FakeEngine

SHELL_CALL = '<tool_call>\n{"name": "shell", "arguments": {"command": ["ls"]}}\n</tool_call>'

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
        # the next turn: the call and its output appended to the input, as Codex keeps
        # its history (store: false)
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
