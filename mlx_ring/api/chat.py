"""What a chat request asks of the served model beyond its messages: the messages as chat templates
take them, tools (rendered by the template, their calls parsed by mlx-lm's parser for the family),
and the grammar a constrained answer must match (JSON, a JSON schema, a forced tool call)."""

import json

from mlx_ring.api.errors import ApiError
from mlx_ring.api.openai_request import ChatCompletionRequest, ChatMessage
from mlx_ring.api.produced import ProducedTurns, Written
from mlx_ring.api.served import ServedModel
from mlx_ring.serving.grammar_text import json_grammar, tool_call_grammar

# mlx-lm's tool parsers, by the families whose templates they read (mlx_lm/tool_parsers).
TOOL_FAMILIES = (
    "json_tools: Qwen2.5, Qwen3, Hermes-style <tool_call> JSON; qwen3_coder; mistral; glm47; "
    "kimi_k2; minimax_m2; gemma4; function_gemma; pythonic (LFM2); longcat; minicpm5"
)


def template_messages(
    messages: list[ChatMessage], written: list[Written | None] | None = None
) -> list[dict]:
    """Messages as chat templates take them: text content, a call's arguments as an object
    (templates write them with `tojson`), the id a tool result answers. A message whose `written`
    is not None (an answer of this server's, `found_written`) comes as the text the model wrote,
    its calls in it."""
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m.role, "content": m.text()}
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if written and written[i] is not None:
            msg["content"] = written[i].text
        elif m.tool_calls:
            calls = []
            for c in m.tool_calls:
                try:
                    args = json.loads(c.function.arguments)
                except json.JSONDecodeError:
                    args = c.function.arguments  # not JSON: the template gets the text as it came
                calls.append(
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": args},
                    }
                )
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def found_written(messages: list[ChatMessage], produced: ProducedTurns) -> list[Written | None]:
    """Each message as the model wrote it, where it is an answer `produced` holds."""
    return [
        produced.recall(
            m.text(), [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        )
        if m.role == "assistant"
        else None
        for m in messages
    ]


def tool_calls(served: ServedModel, body: ChatCompletionRequest) -> dict | None:
    """How this answer's tool calls are found in its text (`ToolCallText`'s arguments), or None when
    no tools are offered; a 400 when the model's template has no tool support."""
    tools = body.offered_tools()
    if not tools:
        return None
    tok = served.tokenizer
    if not tok.has_tool_calling:
        raise ApiError(
            400,
            "tools: this model's chat template has no tool support (mlx-lm finds no tool-call "
            "format in it); send the request without tools, or serve a model whose template has "
            f"one ({TOOL_FAMILIES})",
            param="tools",
        )
    return {
        "start": tok.tool_call_start,
        "end": tok.tool_call_end,
        "parse": tok.tool_parser,
        "tools": [t.model_dump(exclude_none=True) for t in tools],
        "single": body.parallel_tool_calls is False,
    }


def output_grammar(served: ServedModel, body: ChatCompletionRequest) -> str | None:
    """The llguidance grammar the answer is decoded under (a forced tool call, JSON, a JSON schema),
    or None; a 400 naming what cannot be enforced."""
    forced = body.forced_tools()
    fmt = body.response_format
    try:
        if forced:
            where, tok = "tool_choice", served.tokenizer
            if tok.tool_parser.__module__ != "mlx_lm.tool_parsers.json_tools":
                raise ApiError(
                    400,
                    "tool_choice: required or a named function is enforced only for models whose "
                    "tool calls are JSON in <tool_call> markers (Qwen2.5, Qwen3, Hermes-style); "
                    "use auto with this model",
                    param="tool_choice",
                )
            grammar = tool_call_grammar(
                [t.model_dump(exclude_none=True) for t in forced],
                tok.tool_call_start,
                tok.tool_call_end,
            )
        elif fmt is not None and fmt.type != "text":
            where = "response_format"
            grammar = json_grammar(fmt.json_schema.schema_ if fmt.type == "json_schema" else None)
        elif (
            body._call_grammar is not None
            and getattr(served.tokenizer.tool_parser, "__module__", None)
            == "mlx_lm.tool_parsers.json_tools"
        ):
            where, tok = "tools", served.tokenizer
            grammar = body._call_grammar(tok.tool_call_start, tok.tool_call_end)
        else:
            return None
    except ValueError as e:  # llguidance's compiler: a schema it cannot read
        raise ApiError(
            400,
            f"{where}: the schema cannot be compiled for constrained decoding: {e}",
            param=where,
        ) from None
    problem = served.grammars.check(grammar)
    if problem:
        raise ApiError(
            400,
            f"{where}: the schema uses what constrained decoding cannot enforce: {problem}",
            param=where,
        )
    return grammar
