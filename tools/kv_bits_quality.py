"""What KV_BITS costs on real weights, in one process: each held prompt's KV (every token but its
last, as a chat's next turn finds its last turn cached) is kept in blocks and loaded back by a
rank's own `HeldBlocks` (quantized with KV_BITS, and unquantized for the reference), then mlx-lm's
model continues greedily from it. Against the unquantized run: the tokens that agree before the
first divergence, the share of all tokens equal, and the drift of the reference's chosen tokens'
logprobs (both runs fed the reference's tokens in one pass). Also a full block's bytes as the arrays
hold them, at the model's dtype and at float16, unquantized and at each KV_BITS.

    .venv/bin/python tools/kv_bits_quality.py --bits 8 4

The prompts are the prose of a few docs pages, wrapped in the model's chat template; `--model`
defaults to the server's default model, resolved as the server resolves it.
"""

import argparse
import json
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_config, load_model, load_tokenizer

from mlx_ring.cache.blocks import BLOCK, chain_keys, key_ints
from mlx_ring.cache.held import HeldBlocks
from mlx_ring.cache.kvbits import OFF, KVBits, for_model
from mlx_ring.models.compat import cache_from_saved, prefill_span
from mlx_ring.models.shape import read_shape
from mlx_ring.models.source import resolve_model
from mlx_ring.settings import read

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("mac.md", "planning.md", "hosts.md", "speculative.md")
ASK = "\n\nSummarise the text above in a few sentences."


def prose(pages: tuple[str, ...]) -> list[str]:
    """The docs pages' paragraphs of plain text: no headings, tables, lists or code."""
    out = []
    for page in pages:
        text = re.sub(r"^```.*?^```", "", (ROOT / "docs" / page).read_text(), flags=re.S | re.M)
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            if len(para) > 200 and not para.startswith(("#", "|", "-", "!", "1.")):
                out.append(para)
    return out


def prompts(tokenizer, n: int, shortest: int, longest: int) -> list[list[int]]:
    """`n` chat prompts from `shortest` to `longest` tokens (about: the text is cut by tokens and
    read back), each from its own place in the docs."""
    paras, out = prose(PAGES), []

    def chat(text: str) -> list[int]:
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text + ASK}], add_generation_prompt=True
            )
        )

    frame = len(chat(""))
    for i in range(n):
        want = shortest + (longest - shortest) * i // max(1, n - 1)
        start = (i * len(paras)) // n
        ids = tokenizer.encode("\n\n".join(paras[start:] + paras[:start]), add_special_tokens=False)
        out.append(chat(tokenizer.decode(ids[: want - frame])))
    return out


def restored(model, helds: list[HeldBlocks], prompt: list[int], block: int) -> list[list]:
    """For each of `helds`: the per-layer (keys, values) of all of `prompt` but its last token,
    kept in blocks as a SAVE keeps them, and loaded back as a LOAD does."""
    n = len(prompt) - 1
    caches = make_prompt_cache(model)
    model(mx.array([prompt[:n]]), cache=caches)
    keys = chain_keys(prompt[:n], helds[0].salt, block, tail=True)
    lines = [[0, n, i * block, 1, *key_ints(k)] for i, k in enumerate(keys)]
    out = []
    for held in helds:
        held.keep(lines, block, lambda row, _n, s, e: [prefill_span(c, row, s, e) for c in caches])
        out.append(held.load([[key_ints(k) for k in keys]], n)[0])
        held.ram.clear()
    return out


def greedy(model, layers, prompt: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt`, its start restored from `layers`."""
    n = len(prompt) - 1
    cache = [cache_from_saved(kv, n) for kv in layers]
    logits = model(mx.array([prompt[n:]]), cache=cache)[0, -1]
    tokens = []
    for _ in range(steps):
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([tokens[-1:]]), cache=cache)[0, -1]
    return tokens


def logprobs(model, layers, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The logprob of each of `tokens` after `prompt` and the tokens before it, in one pass over
    them, the prompt's start restored from `layers`."""
    n = len(prompt) - 1
    cache = [cache_from_saved(kv, n) for kv in layers]
    logits = model(mx.array([prompt[n:] + tokens[:-1]]), cache=cache)[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return np.array(mx.take_along_axis(lp, mx.array(tokens)[:, None], axis=-1)[:, 0])


def block_bytes(layers: list, block: int, kv: KVBits, dtype) -> int:
    """A full block's bytes of all layers, its KV in `dtype`, kept as `kv` says."""
    cut = [tuple(a[..., :block, :].astype(dtype) for a in layer) for layer in layers]
    packed = kv.pack(cut)
    mx.eval(packed)
    return sum(a.nbytes for layer in packed for a in layer)


def measure(model, held: dict, runs: list, tokens: int, block: int) -> tuple[dict, list]:
    """Each KV_BITS' figures over the prompts `runs` (`held`: a rank's blocks for each, 0 the
    unquantized), and the longest prompt's unquantized KV."""
    bits = [b for b in held if b]
    figures = {b: {"agree": [], "equal": [], "drift": []} for b in bits}
    for i, prompt in enumerate(runs):
        plain, *quantized = restored(model, list(held.values()), prompt, block)
        want = greedy(model, plain, prompt, tokens)
        want_lp = logprobs(model, plain, prompt, want)
        for b, layers in zip(bits, quantized):
            same = [x == y for x, y in zip(greedy(model, layers, prompt, tokens), want)]
            f = figures[b]
            f["agree"].append(same.index(False) if False in same else len(same))
            f["equal"].append(sum(same))
            f["drift"].extend(np.abs(logprobs(model, layers, prompt, want) - want_lp).tolist())
        print(f"prompt {i}: {len(prompt)} tokens", flush=True)
    rows = {
        b: {
            "group": held[b].kv.group,
            "agree_mean": float(np.mean(f["agree"])),
            "agree_min": int(min(f["agree"])),
            "equal_share": sum(f["equal"]) / (tokens * len(runs)),
            "drift_mean": float(np.mean(f["drift"])),
            "drift_max": float(np.max(f["drift"])),
        }
        for b, f in figures.items()
    }
    return rows, plain


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="MODEL as the server takes it (default: its own)")
    p.add_argument("--bits", type=int, nargs="+", default=[8, 4], choices=(8, 4))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--shortest", type=int, default=300, help="tokens of the first prompt")
    p.add_argument("--longest", type=int, default=1000, help="tokens of the last prompt")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens after each prompt")
    p.add_argument("--block", type=int, default=BLOCK, help="PROMPT_CACHE_BLOCK")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args()
    path = resolve_model(a.model, Path(read("CACHE_DIR")).expanduser(), read("WEIGHTS"))
    model, _ = load_model(path)
    shape = read_shape(load_config(path))
    held = {b: HeldBlocks(0) for b in (0, *a.bits)}
    for b, h in held.items():
        h.kv = for_model(b, shape)
    runs = prompts(load_tokenizer(path), a.prompts, a.shortest, a.longest)
    rows, last = measure(model, held, runs, a.tokens, a.block)
    lengths = [len(r) for r in runs]
    print(
        f"\n{path.name}: {len(runs)} prompts of {min(lengths)}-{max(lengths)} tokens, "
        f"{a.tokens} greedy tokens each, KV in {last[0][0].dtype}, blocks of {a.block}\n"
    )
    print(
        "| KV_BITS | group | tokens agreeing before the first divergence (mean, min) "
        "| tokens equal | mean, max \\|logprob drift\\| |"
    )
    print("| --- | --- | --- | --- | --- |")
    for b, row in rows.items():
        print(
            f"| {b} | {row['group']} | {row['agree_mean']:.1f}, {row['agree_min']} "
            f"| {100 * row['equal_share']:.1f}% | {row['drift_mean']:.4f}, {row['drift_max']:.4f} |"
        )
    sizes = {}
    print(f"\nOne full block ({a.block} tokens, every layer) as the arrays hold it:\n")
    print("| KV dtype | unquantized | " + " | ".join(f"{b} bits" for b in a.bits) + " |")
    print("| --- | --- |" + " --- |" * len(a.bits))
    for dtype in dict.fromkeys((last[0][0].dtype, mx.float16)):
        name = str(dtype).removeprefix("mlx.core.")
        raw = block_bytes(last, a.block, OFF, dtype)
        cells = {b: block_bytes(last, a.block, held[b].kv, dtype) for b in a.bits}
        sizes[name] = {"unquantized": raw, **cells}
        print(
            f"| {name} | {raw / 1024:.0f} KiB | "
            + " | ".join(f"{c / 1024:.0f} KiB ({c / raw:.1%})" for c in cells.values())
            + " |"
        )
    if a.json:
        out = {"model": path.name, "prompt_tokens": lengths, "tokens": a.tokens}
        a.json.write_text(json.dumps(out | {"bits": rows, "block_bytes": sizes}, indent=2))


if __name__ == "__main__":
    main()
