"""What the OpenAI API tests ask and read: the question, a get_weather tool, and a
stream's server-sent events."""

import json

from apiutil import WEATHER

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER,
        },
    }
]


def events(response) -> list:
    """A stream's server-sent events: JSON objects, then the closing "[DONE]"."""
    lines = [ln for ln in response.text.split("\n\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines), response.text
    return [ln[6:] if ln == "data: [DONE]" else json.loads(ln[6:]) for ln in lines]
