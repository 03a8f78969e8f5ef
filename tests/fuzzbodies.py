"""Generated request bodies for every field of the API: hostile values (extremes, out of range,
wrong types) and plausible ones (the right type across the documented range and the model's
edges, so that a request passes the schema and its values reach the checks behind it). Used
against the app in process (tests/unit/api/test_openai_errors.py) and against a real ring
(tests/ring/test_adversarial.py)."""

from hypothesis import strategies as st

MODEL = "SmolLM2-135M-Instruct"

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, -1, 1, 0.5, 1.5, 2, 2.0000001, 100, 1e308, -1e308]),
)
token_ids = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, 1, 2, 49151, 49152, 99_999_999, -5, 2**31, 2**63]),
)
odd_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["", "\x00", "\ufffd", "\ud800", "🦜", "\u202e", "a\nb", "</s>", "<|im_end|>"]
)
bias_keys = st.one_of(
    token_ids.map(str),
    st.sampled_from(["-5", "", " 1", "1.0", "1e3", "٣", "0x10", "00042"]),
    odd_text,
)
ids = st.integers(0, 2**40) | st.sampled_from([0, 1, 2, 49151, 49152, 99_999_999, 2**31, 2**63])
# Hostile values for every field: extremes, out of range, wrong types.
HOSTILE = {
    "temperature": numbers,
    "top_p": numbers,
    "top_k": token_ids,
    "min_p": numbers,
    "seed": token_ids | numbers,
    "max_tokens": token_ids,
    "max_completion_tokens": token_ids,
    "presence_penalty": numbers,
    "frequency_penalty": numbers,
    "repetition_penalty": numbers,
    "logit_bias": st.dictionaries(bias_keys, numbers, max_size=3),
    "stop": odd_text | st.lists(odd_text, max_size=6),
    "n": token_ids,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | junk}),
    "logprobs": st.booleans() | token_ids,
    "top_logprobs": token_ids,
    "user": odd_text,
    "model": odd_text | st.just(MODEL),
    "messages": st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant", "tool", "wizard"]),
                "content": odd_text | st.none() | junk,
            }
        ),
        max_size=3,
    ),
    "prompt": odd_text | st.lists(token_ids, max_size=4),
    "echo": st.booleans(),
    "suffix": odd_text,
}
# Plausible values: the right type and shape, across the documented range and the model's
# edges, so that a request passes the schema and its values reach the checks behind it (and
# MLX, if those miss).
PLAUSIBLE = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(0, 60000),
    "min_p": st.floats(0, 1),
    "seed": st.integers(-(2**70), 2**70),
    "max_tokens": st.integers(1, 4),
    "max_completion_tokens": st.integers(1, 4),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.1, 10),
    "logit_bias": st.dictionaries(ids.map(str), st.floats(-100, 100), min_size=1, max_size=3),
    "stop": odd_text | st.lists(odd_text, max_size=4),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20),
    "prompt": st.lists(ids, min_size=1, max_size=4),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"]), "content": odd_text}
        ),
        min_size=1,
        max_size=3,
    ),
}
VALID = {"temperature": 0.0, "max_tokens": 2}


@st.composite
def bodies(draw):
    chat = draw(st.booleans())
    body = dict(
        VALID, **({"messages": [{"role": "user", "content": "Hi"}]} if chat else {"prompt": "Hi"})
    )
    for name in draw(
        st.lists(st.sampled_from(sorted(HOSTILE)), min_size=1, max_size=3, unique=True)
    ):
        roll = draw(st.integers(0, 9))
        body[name] = draw(
            junk
            if roll == 0
            else PLAUSIBLE.get(name, HOSTILE[name])
            if roll >= 5
            else HOSTILE[name]
        )
    return ("/v1/chat/completions" if chat else "/v1/completions"), body
