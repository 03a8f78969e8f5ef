"""A row's draw as mlx-lm's `make_sampler` makes it (top-p, min-p, top-k, then the temperature),
with each setting given to MLX as an array rather than a number. mlx-lm compiles each step with
its setting inside (`mx.compile` takes a number as a constant, and writes it into the kernel's
source), so a request with a new temperature, top-p or min-p waited for new kernels to be built;
as an input, the kernels the warm-up built serve every value (serving/warmup.py). The tokens
drawn are mlx-lm's, value for value."""

import math
from functools import partial

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p


class Draw:
    """One row's filters and draw for its settings (`params`: serving/params.SamplingParams with
    a temperature above 0); called on log-probabilities `(B, V)`, it draws `(B,)` ids from MLX's
    global random state, as mlx-lm's sampler does."""

    def __init__(self, params):
        self.top_p = mx.array(params.top_p) if 0 < params.top_p < 1.0 else None
        self.min_p, self.top_k = params.min_p, params.top_k
        self.temperature = params.temperature
        self._typed: dict = {}  # dtype -> (log(min_p), 1 / temperature) in that dtype

    def scalars(self, dtype) -> tuple[mx.array | None, mx.array]:
        """log(min_p) and 1 / temperature in `dtype`, as mlx-lm's numbers meet the logits."""
        if dtype not in self._typed:
            if not 0 <= self.min_p <= 1.0:  # mlx-lm's check and words (apply_min_p)
                raise ValueError(
                    f"`min_p` has to be a float in the [0, 1] interval, but is {self.min_p}"
                )
            log_min_p = mx.array(math.log(self.min_p), dtype) if self.min_p != 0 else None
            self._typed[dtype] = (log_min_p, mx.array(1.0 / self.temperature, dtype))
        return self._typed[dtype]

    def filter(self, logprobs: mx.array) -> mx.array:
        """`logprobs` with the tokens top-p, min-p and top-k leave out at -inf."""
        log_min_p, _ = self.scalars(logprobs.dtype)
        if self.top_p is not None:
            logprobs = apply_top_p(logprobs, self.top_p)
        if log_min_p is not None:
            logprobs = _min_p(logprobs, log_min_p)
        if self.top_k > 0:  # its k shapes the graph, not a kernel: a new k builds none
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs

    def target(self, logprobs: mx.array) -> mx.array:
        """The logits this row draws from: filtered, then over the temperature."""
        return self.filter(logprobs) * self.scalars(logprobs.dtype)[1]

    def __call__(self, logprobs: mx.array) -> mx.array:
        return _categorical(self.filter(logprobs), self.scalars(logprobs.dtype)[1])


@mx.compile
def _min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    # mlx-lm's apply_min_p with min_tokens_to_keep=1, its one use here
    top = mx.max(logprobs, axis=-1, keepdims=True)
    return mx.where(logprobs < top + log_min_p, -float("inf"), logprobs)


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def _categorical(logits: mx.array, inverse_temperature: mx.array) -> mx.array:
    # mlx-lm's categorical_sampling, its temperature an input
    return mx.random.categorical(logits * inverse_temperature)
