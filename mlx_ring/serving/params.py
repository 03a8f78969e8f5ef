"""A request's sampling settings as the engine takes them: plain data, no MLX (the
HTTP schema builds them)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to report per token (0: none)
    # llguidance grammar the output must match (serving/grammar.py), else free
    grammar: str | None = None
    # report each token's log-probability (False: no need to normalise the logits)
    logprobs: bool = True

    def plain(self) -> bool:
        """No processors, no seed, no alternatives: rows with equal plain params
        sample in one call."""
        return self.speculable() and self.seed is None

    def speculable(self) -> bool:
        """No processor reads the history and no alternatives are reported: the distribution at
        every position is the model's alone, so drafted tokens can be verified in one pass."""
        return not (
            self.repetition_penalty
            or self.presence_penalty
            or self.frequency_penalty
            or self.logit_bias
            or self.top_logprobs
            or self.grammar
        )
