"""The model types this server splits, as the model matrix found them, and the sentence that refuses
the others at startup.

A rank runs the model's own forward (mlx-lm's code) on its cut of the layer list
(`mlx_ring.models.slicing`), so masks, scales, soft-capping and cache kinds are mlx-lm's. Which
types that is right for is not written here but measured: tests/ring/test_model_matrix.py runs a
tiny random model of every type mlx-lm ships split over 2 and 3 ranks against single-process mlx-lm,
and `supported.json` beside this file records the result (admitted types with their cache kinds;
refused types with the reason their run found). docs/models.md's table is made from the same file.
"""

import json
from pathlib import Path

import mlx_lm

from mlx_ring.models.shape import text_keys

RECORD = Path(__file__).with_name("supported.json")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
BEGIN, END = "<!-- model matrix: begin (generated) -->", "<!-- model matrix: end -->"


def load() -> dict:
    """The matrix's last recorded result: {"mlx_lm": version, "admitted": {type: {"caches":
    [...]}}, "refused": {type: reason}}."""
    return json.loads(RECORD.read_text())


_record = load()
SUPPORTED: dict[str, dict] = _record["admitted"]
REFUSED: dict[str, str] = _record["refused"]

# Admitted types whose layers cannot take several rows at once: each decode group holds one request.
UNBATCHED = {
    "gemma2": "mlx-lm's Gemma 2 attention cannot take a batch's mask with grouped KV heads",
    "olmo_hybrid": (
        "a decode group of several rows differs from single-process mlx-lm (the matrix found it; "
        "the cause is not traced)"
    ),
    "gpt_bigcode": "mlx-lm's GPTBigCode counts positions from one offset for the whole batch",
    "llama4": "mlx-lm's chunked attention cache (Llama 4) has no batch form",
    "longcat_flash_ngram": (
        "its n-gram embeddings keep each row's last token ids, as many as the row has seen, "
        "which mlx-lm cannot join into one batch"
    ),
}


# Config keys the matrix's tiny models leave off (tests/model_zoo.py sets them to 0), so a
# checkpoint that turns one on is a variant no test has split: Gemma 4 E2B/E4B's per-layer inputs
# are made from the token ids before the first layer, which ranks after the first never see.
UNTESTED = {
    "hidden_size_per_layer_input": "per-layer inputs made from the token ids (Gemma 3n/4 E2B, E4B) "
    "cannot reach the ranks after the first",
    "num_kv_shared_layers": (
        "layers that reuse another layer's keys and values cannot take them from another rank"
    ),
}


def check_supported(config: dict) -> None:
    """ValueError naming the model type and why it is refused, unless the matrix admitted it."""
    kind = config.get("model_type")
    text = text_keys(config)
    on = [k for k in UNTESTED if text.get(k)]
    if kind in SUPPORTED and on:
        raise ValueError(
            f"model type {kind!r} is supported, but not with {on[0]} set: {UNTESTED[on[0]]}"
        )
    if kind in SUPPORTED:
        return
    why = (
        f"its test split across ranks fails: {REFUSED[kind]}"
        if kind in REFUSED
        else f"mlx-lm {_record['mlx_lm']} has no such type, so it is not tested split across ranks"
    )
    raise ValueError(
        f"model type {kind!r} is not supported: {why}; the {len(SUPPORTED)} supported types are "
        "listed in docs/models.md"
    )


def plain_kv(caches: list[str]) -> bool:
    """Whether a type's layers all keep plain KV caches (see `compat.plain_kv_caches`)."""
    return caches == ["KVCache"]


def prompt_cache(caches: list[str]) -> str:
    """How a type's prompts reuse the prompt cache: to the token (plain KV caches), in whole
    blocks (sliding windows, fixed states: cache/states.py), or not (chunked attention)."""
    if plain_kv(caches):
        return "yes"
    return "no" if "ChunkedKVCache" in caches else "whole blocks"


def table() -> str:
    """docs/models.md's table of every type, made from supported.json."""
    rows = [
        "| `model_type` | supported | cache kinds | prompts prefilled together | prompt cache | "
        "speculative decoding |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind in sorted({**SUPPORTED, **REFUSED}):
        if kind in SUPPORTED:
            caches = SUPPORTED[kind]["caches"]
            plain = plain_kv(caches)
            together = (
                "no (one request per decode group)"
                if kind in UNBATCHED
                else "yes"
                if plain
                else "no (each alone)"
            )
            rows.append(
                (
                    f"| `{kind}` | yes | {', '.join(caches)} | {together} | "
                    f"{prompt_cache(caches)} | {'yes' if plain else 'no'} |"
                )
            )
        else:
            rows.append(f"| `{kind}` | no: {REFUSED[kind].replace('|', '/')} | | | | |")
    return "\n".join(rows)


def write(found: dict) -> None:
    """Record the matrix's result (`{type: {"admitted", "reason", "caches"}}`) in supported.json and
    docs/models.md; the module's tables then hold it."""
    global _record
    record = {
        "mlx_lm": mlx_lm.__version__,
        "admitted": {k: {"caches": v["caches"]} for k, v in sorted(found.items()) if v["admitted"]},
        "refused": {k: v["reason"] for k, v in sorted(found.items()) if not v["admitted"]},
        **({"tensor": _record["tensor"]} if "tensor" in _record else {}),
    }
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    _record = record
    SUPPORTED.clear(), SUPPORTED.update(record["admitted"])
    REFUSED.clear(), REFUSED.update(record["refused"])
    text = DOCS.read_text()
    head, rest = text.split(BEGIN, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{summary()}\n\n{table()}\n{END}{rest.split(END, 1)[1]}")


def summary() -> str:
    """One line: how many of mlx-lm's types are admitted."""
    n = len(SUPPORTED) + len(REFUSED)
    return (
        f"{len(SUPPORTED)} of the {n} text-decoder types of mlx-lm {_record['mlx_lm']} are "
        f"supported ({100 * len(SUPPORTED) // n}%)."
    )


TENSOR_BEGIN, TENSOR_END = (
    "<!-- tensor matrix: begin (generated) -->",
    "<!-- tensor matrix: end -->",
)


def tensor_list() -> str:
    """docs/models.md's list of the types tensor mode splits, made from supported.json."""
    found = load().get("tensor", {"admitted": {}, "refused": {}})
    even = [k for k, v in found["admitted"].items() if not v["uneven"]]
    lines = [
        f"{len(found['admitted'])} of the {len(found['admitted']) + len(found['refused'])} "
        "supported types split for tensor mode:",
        "",
        ", ".join(f"`{k}`" for k in sorted(found["admitted"])) + ".",
    ]
    if even:
        lines += [
            "",
            "Of these, only evenly (attention heads, KV heads and MLP columns "
            "dividing by the number of "
            "ranks, as mlx-lm's "
            "own split needs): " + ", ".join(f"`{k}`" for k in sorted(even)) + ".",
        ]
    unshared = [k for k, v in found["admitted"].items() if v["uneven"] and not v.get("shared")]
    if unshared:
        lines += [
            "",
            "Of the others, not on more ranks than the model has KV heads: "
            + ", ".join(f"`{k}`" for k in sorted(unshared))
            + ".",
        ]
    return "\n".join(lines)


def write_tensor(found: dict) -> None:
    """Record the tensor matrix's result (`{type: {"admitted", "reason", "uneven", "shared"}}`) in
    supported.json and docs/models.md."""
    record = load()
    record["tensor"] = {
        "admitted": {
            k: {"uneven": v["uneven"], "shared": v["shared"]}
            for k, v in sorted(found.items())
            if v["admitted"]
        },
        "refused": {k: v["reason"] for k, v in sorted(found.items()) if not v["admitted"]},
    }
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    global _record
    _record = record
    text = DOCS.read_text()
    head, rest = text.split(TENSOR_BEGIN, 1)
    DOCS.write_text(
        f"{head}{TENSOR_BEGIN}\n{tensor_list()}\n{TENSOR_END}{rest.split(TENSOR_END, 1)[1]}"
    )
