"""The model rank 0 serves, as the HTTP side sees it (no MLX), and every check of a request against
it: model name, token ids within the vocabulary, lengths within the context."""

import fnmatch
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mlx_ring.api.errors import ApiError
from mlx_ring.models.shape import ModelShape
from mlx_ring.planning.cluster import Cluster


def served_name(setting: str | None, model: str | None, default: str) -> str:
    """The one name the model is served under: SERVED_MODEL_NAME when set, else the MODEL
    setting's last part (a folder's name, a .gguf file's name without `.gguf`), a Hugging
    Face repo id as it is (as vLLM names it), or `default` (the default model's name)
    when MODEL is unset."""
    if setting:
        return setting
    if not model:
        return default
    path = Path(model.rstrip("/\\")).expanduser()
    if path.suffix == ".gguf":
        return path.stem
    if model.count("/") == 1 and not model.startswith((".", "/", "~")) and not path.is_dir():
        # a repo id (models/source.resolve_model's rule), unless such a folder exists here
        return model
    return path.name or model


@dataclass
class ServedModel:
    id: str
    tokenizer: object  # mlx_lm TokenizerWrapper; tokenizing needs no MLX
    context_length: int
    default_max_tokens: int
    # token ids a request may name are in [0, vocab_size): the model's and the tokenizer's
    vocab_size: int
    # most completion tokens one request may ask for; 0: the context length
    max_tokens_limit: int = 0
    # the KV room for one request alone: most tokens (prompt and answer) the ring holds the KV cache
    # of; 0: no bound
    request_kv_room: int = 0
    cluster: Cluster = field(default_factory=Cluster)
    grammars: object = None  # serving.grammar.Grammars: checks the grammars of constrained answers
    # MODEL_ALIASES: other names or patterns a request may name the model by
    aliases: tuple[str, ...] = ()
    # the model's config.json (what /api/show tells of it)
    config: dict = field(default_factory=dict)
    shape: ModelShape | None = None  # its shape as models/shape.py reads it (None: unknown)
    parameters: int = 0  # the model's parameter count (0: unknown)
    weights: str = ""  # how its weights are held: "int4" (MLX's quantization), "float32", ...

    def names(self) -> list[str]:
        """The names `/v1/models` and `/api/tags` list: the served name, then every alias that is a
        name rather than a pattern."""
        return [
            self.id,
            *(a for a in self.aliases if not any(c in a for c in "*?[") and a != self.id),
        ]

    def answers_to(self, name: str | None) -> bool:
        """A request naming `name` is for this model: no name, `default`, the served
        name or an alias."""
        return name in (None, "", self.id, "default") or any(
            fnmatch.fnmatchcase(name, a) for a in self.aliases
        )

    @cached_property
    def max_prompt_chars(self) -> int:
        """Text longer than this cannot fit the context: no token covers more
        characters than its vocabulary entry has (byte-level entries: one a byte), so
        such text is refused untokenized."""
        return self.context_length * max(map(len, self.tokenizer.get_vocab()))


def check_text_length(served: ServedModel, field: str, chars: int) -> None:
    """A 400 for text that cannot fit the context, before tokenizing it (which
    takes seconds a MB)."""
    if chars > served.max_prompt_chars:
        raise ApiError(
            400,
            f"{field}: {chars} characters cannot fit the model's context of "
            f"{served.context_length} tokens; shorten it",
            param=field,
            code="context_length_exceeded",
        )


def check_ids(served: ServedModel, field: str, ids) -> None:
    """Every token id a request names must index the model's vocabulary: MLX does not check
    bounds when it gathers or scatters, and an id past the end crashes the process."""
    bad = next((t for t in ids if not 0 <= t < served.vocab_size), None)
    if bad is not None:
        raise ApiError(
            400,
            (
                f"{field}: token id {bad} is outside this model's vocabulary; use ids in [0, "
                f"{served.vocab_size})"
            ),
            param=field,
        )


def check_sampling(served: ServedModel, body) -> None:
    check_ids(served, "logit_bias", [int(k) for k in body.logit_bias or {}])
    if body.top_k >= served.vocab_size:
        raise ApiError(
            400,
            (
                f"top_k: {body.top_k} keeps the whole vocabulary of {served.vocab_size} tokens or "
                "more; use 0 (off) or fewer"
            ),
            param="top_k",
        )


def check_model(served: ServedModel, name: str | None) -> None:
    if not served.answers_to(name):
        raise ApiError(
            404,
            f"The model '{name}' does not exist; this server serves '{served.id}' (MODEL_ALIASES "
            "adds other names)",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def _held(served: ServedModel) -> tuple[int, str]:
    """The tokens one request may hold (prompt and answer), and what bounds them, in words."""
    held = min(served.context_length, served.request_kv_room or served.context_length)
    return held, (
        f"the model's context is {held}"
        if held == served.context_length
        else f"the ring's memory holds the KV cache of {held} tokens for one request (the "
        f"model's context: {served.context_length})"
    )


def context_room(served: ServedModel, prompt_tokens: int) -> int:
    """Completion tokens the context (or the ring's memory for its KV cache)
    leaves after the prompt."""
    return _held(served)[0] - prompt_tokens


def context_cuts(served: ServedModel, prompt_tokens: int, asked: int) -> bool:
    """Whether the room the context leaves, not `asked` nor the server's limit,
    bounds a clamped answer."""
    return context_room(served, prompt_tokens) < min(
        asked, served.max_tokens_limit or served.context_length
    )


def max_tokens_for(served: ServedModel, prompt: list[int], body) -> int:
    """The completion limit for `prompt`, or a 400 when it does not fit the context or the
    server's limit. A request that clamps (the agent dialects) gets what is left where it asks
    for more, instead of a 400."""
    held, what = _held(served)
    room = held - len(prompt)
    if room <= 0:
        raise ApiError(
            400,
            f"the prompt has {len(prompt)} tokens but {what}; shorten it",
            param="messages",
            code="context_length_exceeded",
        )
    cap = served.max_tokens_limit or served.context_length
    if body.clamps and body.max_tokens_asked() is not None:
        return min(body.max_tokens_asked(), room, cap)
    for name in ("max_tokens", "max_completion_tokens"):
        asked = getattr(body, name, None)
        if asked is not None and asked > cap:
            raise ApiError(
                400,
                (
                    f"{name}={asked} is over this server's limit of {cap} "
                    "(MAX_TOKENS_LIMIT); ask for fewer"
                ),
                param=name,
            )
    asked = body.max_tokens_asked()
    if asked is not None and asked > room:
        raise ApiError(
            400,
            (
                f"max_tokens={asked} plus the prompt's {len(prompt)} tokens is more than {held}: "
                f"{what}; ask for at most {room}"
            ),
            param="max_tokens",
            code="context_length_exceeded",
        )
    return (
        asked
        if asked is not None
        else min(room, cap, body.default_tokens or served.default_max_tokens)
    )
