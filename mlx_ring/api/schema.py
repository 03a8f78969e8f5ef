"""What the request models of every dialect share: the strict base, the sampling fields and
their bounds, and the response formats."""

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, WithJsonSchema, model_validator

from mlx_ring.serving.params import SamplingParams

MAX_STOP = 4
MAX_CHOICES = 8
NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function and schema names


class _Strict(BaseModel):
    # An unknown field is an error, not silently dropped: the client learns what we do not support.
    # Strict types: `false` is not 0 and "1" is not 1.
    model_config = ConfigDict(extra="forbid", strict=True)
    # Fields of the real API that would change the answer and that this server cannot honour:
    # refused by name and why ("Extra inputs are not permitted" is left for typos).
    # `harmless`: values that ask for nothing this server does not do (modalities ["text"]),
    # or a test of the value.
    unsupported: ClassVar[dict[str, str]] = {}
    harmless: ClassVar[dict[str, object]] = {}

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, data):
        for name, why in cls.unsupported.items():
            if not isinstance(data, dict) or data.get(name) is None:
                continue
            ok = cls.harmless.get(name)
            if not (ok(data[name]) if callable(ok) else data[name] == ok):
                raise ValueError(f"{name}: not supported by this server/model: {why}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _whole_floats(cls, data):
        # JSON Schema counts 3.0 as an integer; strict pydantic does not. Accept whole floats for
        # integer fields (and lists of them), nothing else.
        def whole(v):
            return int(v) if isinstance(v, float) and v.is_integer() else v

        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if (
                field is None
                or "int" not in str(field.annotation)
                or "float" in str(field.annotation)
            ):
                continue
            out[name] = [whole(x) for x in value] if isinstance(value, list) else whole(value)
        return out


class Refused(BaseModel):
    """A part recognised only to be refused with a message that says where and why; documented as
    matching nothing, so that /openapi.json shows what is taken."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        return {"not": {}, "description": "Not supported: this server's models read text only."}


def only_with(field: str, needs: str, when: dict, then: dict) -> dict:
    """JSON Schema for "`field` (matching `when`) only with `needs` matching `then`", so clients
    can see the rule."""
    return {
        "if": {"required": [field], "properties": {field: when}},
        "then": {"required": [needs], "properties": {needs: then}},
    }


def hosted_tools_refused(data, runs: tuple[str, ...], send: str):
    """`data` (a request body) unless a tool in it has a type outside `runs`: a tool the API's own
    servers would run (web search, code execution, ...), which this server does not."""
    tools = data.get("tools") if isinstance(data, dict) else None
    for i, t in enumerate(tools if isinstance(tools, list) else []):
        kind = t.get("type") if isinstance(t, dict) else None
        if isinstance(kind, str) and kind not in runs:
            raise ValueError(
                (
                    f"tools.{i}: {kind} tools are not supported by this server: it runs no "
                    f"tools itself; send {send}"
                )
            )
    return data


# /openapi.json names a model that shares its name with another dialect's by its module
# (mlx_ring__api__schema__TextFormat): the formats stay here so that the document does not change.
class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(_Strict):
    name: str = Field(pattern=NAME)
    description: str | None = None
    schema_: dict | None = Field(
        None, alias="schema", description="A JSON Schema; the answer is decoded to match it."
    )
    strict: bool | None = None


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StreamOptions(_Strict):
    include_usage: bool = False


# Token id (as a string key) -> bias in [-100, 100].
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Annotated[float, Field(ge=-100, le=100)]],
    WithJsonSchema(
        {
            "type": "object",
            "additionalProperties": False,
            "patternProperties": {"^[0-9]+$": {"type": "number", "minimum": -100, "maximum": 100}},
        }
    ),
]


def ids_below(n: int) -> str:
    """A regular expression for decimal token ids in [0, n) (leading zeros allowed, as int() reads
    them), for the JSON Schema of `logit_bias` keys once the vocabulary is known."""
    top = str(n - 1)
    same_length = [top]  # numbers of top's length that are at most top: a smaller digit at place i
    for i, d in enumerate(top):
        low, high = 1 if i == 0 else 0, int(d) - 1
        if high >= low:
            digit = str(low) if high == low else f"[{low}-{high}]"
            rest = len(top) - i - 1
            same_length.append(top[:i] + digit + (f"[0-9]{{{rest}}}" if rest else ""))
    shorter = [f"[1-9][0-9]{{0,{len(top) - 2}}}"] if len(top) > 1 else []
    return f"^0*(?:{'|'.join(['0', *shorter, *same_length])})$"


_STOP = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
        {"type": "null"},
    ]
}

_STREAM_OPTIONS_RULE = only_with("stream_options", "stream", {"type": "object"}, {"const": True})


class _Sampling(_Strict):
    model_config = ConfigDict(json_schema_extra=_STREAM_OPTIONS_RULE)
    # completion limit when the request names none (None: the server's)
    default_tokens: ClassVar[int | None] = None
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="Extension: keep the k most likely tokens (0: off).")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Extension: min-p sampling (0: off).")
    max_tokens: int | None = Field(None, ge=1)
    stop: Annotated[
        str | Annotated[list[str], Field(fail_fast=True)] | None, WithJsonSchema(_STOP)
    ] = None
    seed: int | None = Field(
        None, ge=-(1 << 63), le=(1 << 63) - 1, description="A 64-bit signed integer."
    )
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(
        None, ge=0.1, le=10.0, description="Extension: mlx-lm's repetition penalty."
    )
    logit_bias: LogitBias | None = None
    n: int = Field(
        1, ge=1, le=MAX_CHOICES, description="Choices to generate; they share one prefill."
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted and ignored: they do not change the answer (README, "Request fields").
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = Field(
        None, description="Ignored: the prompt cache finds shared prefixes itself."
    )
    safety_identifier: str | None = None
    _clamp: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _check(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(
                f"stop: List should have at most {MAX_STOP} stop strings; "
                f"this request has {len(self.stop)}"
            )
        return self

    def clamp_tokens(self):
        """This request's max_tokens over the room its prompt leaves in the context
        is cut to that room, not refused (the agent dialects' choice, as Ollama's and
        LM Studio's); returns self."""
        self._clamp = True
        return self

    @property
    def clamps(self) -> bool:
        return self._clamp

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def sampling(
        self, top_logprobs: int, choice: int = 0, grammar: str | None = None
    ) -> SamplingParams:
        """The engine's parameters for choice `choice` (each choice its own
        seed, so they differ)."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or None,
            frequency_penalty=self.frequency_penalty or None,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            seed=None if self.seed is None else self.seed + choice,
            top_logprobs=top_logprobs,
            grammar=grammar,
            logprobs=self.logprob_count() is not None,
        )


# JSON Schema keywords of a bound, by the JSON type they bound.
BOUNDS = {
    "number": ("minimum", "maximum"),
    "integer": ("minimum", "maximum"),
    "array": ("minItems", "maxItems"),
}


def bounds_of(name: str):
    """The internal request's bounds on its sampling field `name` (minimum, maximum, maxItems), as
    a dialect field's `json_schema_extra`: the dialect's value becomes that field, and is checked
    where the internal request is built (dialects.chat_request), so the bound is held only here and
    /openapi.json shows it on the dialect's field too."""
    own = _Sampling.model_json_schema()["properties"][name]
    branches = own.get("anyOf", [own])
    kept = {k: v for b in branches for k, v in b.items() if k in BOUNDS.get(b.get("type"), ())}

    def document(schema: dict) -> None:
        for branch in schema.get("anyOf", [schema]):
            keys = BOUNDS.get(branch.get("type"), ())
            branch.update({k: v for k, v in kept.items() if k in keys})

    return document
