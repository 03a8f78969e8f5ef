"""Run under mlx.launch by tests/ring/test_tensor_matrix.py: each model, whole in this process and then
split for tensor mode across the launch's ranks (`mlx_ring.models.tensor.cut`), on one prompt and
greedy decode steps.

For each `--model` (with its `--out` folder) every rank writes `started{r}`, then either `refused{r}.txt`
(the ValueError that refuses the split, which every rank reaches alike), or `error{r}.txt` (then the
launch ends: the other ranks would wait in an all_sum forever), or `done{r}` with `want.npy` (the whole
model's logits: the prompt's last row, then each greedy step's) and `got{r}.npy` (the split model's, fed
the whole model's tokens, so rows stay comparable past a near tie), `tokens{r}.json` (the split model's
own greedy tokens, decoded free) and `how{r}.txt` (shard() or layouts).
"""

import argparse
import faulthandler
import json
import os
import sys
import traceback
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlx_ring.models.tensor import cut, model_type
from mlx_ring.ring.transport import init_world


def logits_of(model, prompt: list[int], feed: list[int] | None, steps: int) -> tuple[np.ndarray, list[int]]:
    """Rows of logits (prompt's last, then one per step) and the greedy tokens; with `feed`, each step
    is fed feed's token instead of its own."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [], []
    for i in range(steps):
        rows.append(np.array(logits.astype(mx.float32)))
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([[feed[i] if feed else tokens[-1]]]), cache=cache)[0, -1]
    return np.stack(rows), tokens


def run(folder: Path, out: Path, group, prompt: list[int], steps: int) -> None:
    r = group.rank()
    whole = load_model(folder)[0]
    want, want_tokens = logits_of(whole, prompt, None, steps)
    del whole
    if r == 0:
        np.save(out / "want.npy", want)
        (out / "want.json").write_text(json.dumps(want_tokens))
    model = load_model(folder, lazy=True)[0]
    try:
        how = cut(model, group, model_type(model))
    except ValueError as e:
        (out / f"refused{r}.txt").write_text(str(e))
        return
    mx.eval(model.parameters())
    got, _ = logits_of(model, prompt, want_tokens, steps)
    _, tokens = logits_of(model, prompt, None, steps)
    np.save(out / f"got{r}.npy", got)
    (out / f"tokens{r}.json").write_text(json.dumps(tokens))
    (out / f"how{r}.txt").write_text(how)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, nargs="+")
    p.add_argument("--out", required=True, nargs="+")
    p.add_argument("--prompt", required=True, nargs="+", help="a JSON list of token ids per model")
    p.add_argument("--steps", required=True, nargs="+", type=int, help="greedy steps per model")
    p.add_argument("--stall", type=float, default=60, help="seconds a model may take on this rank")
    a = p.parse_args()
    group = init_world()
    for folder, out, prompt, steps in zip(a.model, a.out, a.prompt, a.steps, strict=True):
        out = Path(out)
        (out / f"started{group.rank()}").write_text("")
        faulthandler.dump_traceback_later(a.stall, exit=True, file=open(out / f"stack{group.rank()}.txt", "w"))
        try:
            run(Path(folder), out, group, json.loads(prompt), steps)
        except Exception as e:  # a rank that failed mid-forward leaves the others in an all_sum: end the launch
            (out / f"error{group.rank()}.txt").write_text(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            sys.stderr.flush()
            os._exit(3)
        finally:
            faulthandler.cancel_dump_traceback_later()
        (out / f"done{group.rank()}").write_text("")


if __name__ == "__main__":
    main()
