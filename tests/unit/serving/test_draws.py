"""serving/draws.py: mlx-lm's sampler chain with its settings as arrays draws mlx-lm's own tokens,
value for value, and refuses what mlx-lm refuses."""

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_sampler

from mlx_ring.serving.draws import Draw
from mlx_ring.serving.params import SamplingParams


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.7),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.9, min_p=0.05),
        dict(temperature=1.0, top_k=7),
        dict(temperature=0.6, top_p=0.95, min_p=0.02, top_k=50),
    ],
)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_the_draw_is_mlx_lms_token_for_token(settings, dtype):
    logits = (mx.random.normal((3, 512), key=mx.random.key(11)) * 3).astype(dtype)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mine, theirs = (
        Draw(SamplingParams(**settings)),
        make_sampler(
            settings["temperature"],
            settings.get("top_p", 0.0),
            settings.get("min_p", 0.0),
            top_k=settings.get("top_k", 0),
        ),
    )
    got = []
    for draw in (mine, theirs):
        mx.random.seed(5)
        got.append([draw(logprobs).tolist() for _ in range(8)])
    assert got[0] == got[1] and len({tuple(t) for t in got[0]}) > 1


def test_a_min_p_outside_its_range_is_refused_in_mlx_lms_words():
    with pytest.raises(ValueError, match=r"`min_p` has to be a float in the \[0, 1\] interval"):
        Draw(SamplingParams(min_p=1.5))(mx.zeros((1, 8)))
