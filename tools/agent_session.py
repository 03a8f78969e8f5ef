"""bench_agent.py's coding-agent session, built without a server: turn 1 is Claude Code's captured
request (its system blocks, some or all of its tools), each later turn appends the last answer, a
tool result of seeded pseudo-text and a short user message, and every turn carries a billing line
of its own (a new `cch=` value, as Claude Code sends). Also the same conversation as an OpenAI chat
body, for servers without an Anthropic route.
"""

import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Callable

from mlx_ring.api.anthropic_request import CountTokensRequest

CAPTURE = Path(__file__).resolve().parents[1] / "tests/data/clients/claude_code_2.1_messages.json"
# The captured line's version and entry point; the `cch=` value is new on every request.
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli; cch={};"
# A coding session reads and edits files and runs commands: these tools come first.
FIRST_TOOLS = ("Read", "Edit", "Write", "Bash")
TASK = "The tests in this project fail. Read the files I give you and find out why."
ASKS = [
    "What does this file do?",
    "Is the bug in there?",
    "Which function should change?",
    "Now the next file.",
    "Say it in one line.",
    "What would you test first?",
]
WORDS = (
    "self value index count items result buffer token prompt cache layer rank ring shard step "
    "batch queue stream offset length return import class def if else for while in not and or "
    "None True False list dict tuple str int float path file open read write close error raise "
    "try except with as yield async await lambda key size block entry table hash prefix tail "
    "head next last first start stop time model state config server client request answer"
).split()
TOOL_RESULT_TOKENS = (500, 2000)
Count = Callable[[str], int]


def capture() -> dict:
    """The captured request body of Claude Code 2.1 (`claude -p 'Say hello'`)."""
    return json.loads(CAPTURE.read_text())["body"]


def billing_line(seed: int, turn: int) -> dict:
    """The billing block of `turn`: a `cch=` value of its own, the same for the same seed."""
    cch = hashlib.sha256(f"{seed}:{turn}".encode()).hexdigest()[:5]
    return {"type": "text", "text": BILLING.format(cch)}


def ordered_tools(tools: list[dict]) -> list[dict]:
    """The captured tools, the file and shell tools first, then the rest as captured."""
    first = [t for name in FIRST_TOOLS for t in tools if t["name"] == name]
    return first + [t for t in tools if t not in first]


def pick_tools(tools: list[dict], n: int | None, budget: int, count: Count) -> list[dict]:
    """`n` tools in `ordered_tools`' order, or (None) as many as fit `budget` tokens, at least
    one: Claude Code never sends a body without tools."""
    tools = ordered_tools(tools)
    if n is not None:
        return tools[:n]
    picked, used = [], 0
    for t in tools:
        used += count(json.dumps(t))
        if picked and used > budget:
            break
        picked.append(t)
    return picked


def file_text(rng: random.Random, tokens: int, count: Count, bounds=TOOL_RESULT_TOKENS) -> str:
    """A file as Claude Code's Read tool shows it (numbered lines) of about `tokens` tokens: lines
    of words until it reaches them, never past the bounds' top."""
    lines, used = [], 0
    while used < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        line = f"{len(lines) + 1:>6}\t{'    ' * rng.randint(0, 2)}{words}\n"
        n = count(line)
        if used + n > bounds[1]:
            break
        lines.append(line)
        used += n
    return "".join(lines)


class Session:
    """The conversation so far; `body()` is the next request's body, `advance(answer)` takes the
    last answer's content blocks and adds the next turn."""

    def __init__(
        self, body: dict, tools: list[dict], seed: int, count: Count, skills: bool = False
    ):
        self.seed, self.count, self.turn = seed, count, 1
        self.system = body["system"][1:]  # the captured billing line is replaced every turn
        self.tools = tools
        first = copy.deepcopy(body["messages"][0])
        first["content"][-1]["text"] = TASK
        # The agent and skill list (a mid-conversation system message) only when asked for:
        # it would take a large share of a small model's context.
        self.messages = [first] + ([copy.deepcopy(body["messages"][1])] if skills else [])
        self.extras = {
            k: body[k] for k in ("metadata", "thinking", "context_management", "output_config")
        }

    def body(self, max_tokens: int) -> dict:
        """The request of this turn in Claude Code's shape, greedy (the client streams it)."""
        return {
            "model": "default",
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "system": [billing_line(self.seed, self.turn), *copy.deepcopy(self.system)],
            "tools": copy.deepcopy(self.tools),
            "messages": copy.deepcopy(self.messages),
            **copy.deepcopy(self.extras),
        }

    def advance(self, answer: list[dict]) -> int:
        """Append `answer` (the assistant's content blocks as returned), a tool result (for its
        first tool call, else in a user message) and a short question; the tokens added, about."""
        rng = random.Random(f"{self.seed}:tool:{self.turn}")
        path = f"src/{rng.choice(WORDS)}_{rng.choice(WORDS)}.py"
        text = file_text(rng, rng.randint(*TOOL_RESULT_TOKENS), self.count)
        ask = ASKS[(self.turn - 1) % len(ASKS)]
        calls = [b for b in answer if b["type"] == "tool_use"]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": c["id"], "content": text if i == 0 else "ok"}
                for i, c in enumerate(calls)
            ]
        else:
            results = [{"type": "text", "text": f"Here is {path}:\n{text}\n"}]
        self.messages += [
            {"role": "assistant", "content": copy.deepcopy(answer) or ""},
            {"role": "user", "content": results + [{"type": "text", "text": ask}]},
        ]
        self.turn += 1
        shown = json.dumps(answer) + json.dumps(results) + ask
        return self.count(shown) + 12  # and each message's template around it


def openai_body(body: dict) -> dict:
    """The same conversation as an OpenAI chat body, as this server reads the Anthropic one: the
    system blocks in one system message without the billing line (a server that cannot leave it out
    would see a new prompt start every turn), tools in the function shape, tool results as tool
    messages."""
    fields = {k: body[k] for k in ("model", "system", "tools", "messages")}
    return CountTokensRequest.model_validate(fields).chat() | {
        "max_tokens": body["max_tokens"],
        "temperature": body["temperature"],
    }
