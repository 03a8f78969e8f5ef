"""Typed OpenAI request models and the one adapter from them to the engine's internal types."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from generate import SamplingParams

MAX_STOP = 4
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    # An unknown field is an error, not silently dropped: the client learns what we do not support.
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="Extension: keep the k most likely tokens (0: off).")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Extension: min-p sampling (0: off).")
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, description="Extension: mlx-lm's repetition penalty.")
    logit_bias: dict[str, float] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _check(self):
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} stop sequences are allowed")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.logit_bias:
            for k, v in self.logit_bias.items():
                if not k.lstrip("-").isdigit() or not -100 <= v <= 100:
                    raise ValueError("logit_bias: keys must be token ids and values within [-100, 100]")
        return self

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def sampling(self, top_logprobs: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or None,
            frequency_penalty=self.frequency_penalty or None,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            seed=self.seed,
            top_logprobs=top_logprobs,
        )


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_count(self) -> int | None:
        """None: no logprobs; else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    max_tokens: int | None = Field(16, ge=1)
    echo: Literal[False] = False
    suffix: None = None

    def token_limit(self) -> int | None:
        return self.max_tokens

    def logprob_count(self) -> int | None:
        return self.logprobs
