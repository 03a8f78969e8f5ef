"""What the agent tests share: the key Codex's and Claude Code's requests come with, their client
and their streams' data (test_codex.py, test_claude_code.py); and the question, JSON schema and
tool the field tests send in every dialect (test_agent_fields.py, test_dialect_checks.py)."""

import json

from apiutil import client

from mlx_ring.api.keys import Key

KEY = "sk-agent-1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
JSON = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": JSON}]


def events(text: str) -> list[dict]:
    """A named-event SSE body's data objects, in order."""
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]


def agent_client(engine, served):
    return client(engine, served, [Key("agent", f"Bearer {KEY}".encode())])
