"""A request's text, token by token, with the default model's real tokenizer: what a client receives
joined together is what the tokenizer decodes, the end of a sequence included."""

import pytest
from mlx_lm.utils import load_tokenizer

from mlx_ring.serving.textstream import TextStream


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return load_tokenizer(default_model)


def stream_text(tokenizer, ids, stop=()):
    s = TextStream(tokenizer.detokenizer, list(stop))
    pieces = []
    for t in ids:
        pieces.append(s.add(t))
        if s.closed:  # a stop string: the sequence ends here
            break
    pieces.append(s.end())  # the end token arrived (or the length limit); nothing if stopped
    return "".join(p.text for p in pieces if p), s


@pytest.mark.parametrize(
    "text",
    ["Bonjour à tous, ça va? Très bien.", "Smile 🙂 and a parrot 🦜", "Clef 𝄞", "trailing space "],
)
def test_joined_stream_is_the_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text)
    assert stream_text(tokenizer, ids)[0] == tokenizer.decode(ids)


def test_a_character_cut_by_the_end_of_sequence_is_not_dropped(tokenizer):
    ids = tokenizer.encode("A parrot 🦜")  # the parrot is three byte-level tokens
    # mid-character
    cut = next(i for i in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:i]))
    text, _ = stream_text(tokenizer, ids[:cut])
    # as mlx-lm's stream_generate ends it
    assert text == tokenizer.decode(ids[:cut]) and text.endswith("\ufffd")


def test_stop_strings_cut_and_hold_back(tokenizer):
    ids = tokenizer.encode("The capital of France is Paris. It is big.")
    text, s = stream_text(tokenizer, ids, stop=["big", " Paris"])
    assert text == "The capital of France is" and s.stop_hit == " Paris"  # the first in the text
    _, s = stream_text(tokenizer, ids, stop=[" Pa", " Paris"])
    # of two starting at one place, the longer (" Paris" is one token)
    assert s.stop_hit == " Paris"
    s = TextStream(tokenizer.detokenizer, ["France is Lyon"])
    sent = "".join(
        p.text for p in (s.add(t) for t in tokenizer.encode("The capital of France is")) if p
    )
    assert sent == "The capital of "  # "France is" could still grow into the stop string: held back
    assert s.end().text == "France is" and not s.stop_hit


def test_every_token_reaches_the_client_once(tokenizer):
    ids = tokenizer.encode("été 🙂 naïve")
    s = TextStream(tokenizer.detokenizer, [])
    pieces = [s.add(t) for t in ids] + [s.end()]
    assert [t for p in pieces if p for t in p.tokens] == ids
