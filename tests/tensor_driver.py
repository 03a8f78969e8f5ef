"""Run under mlx.launch by tests/ring/test_tensor_matrix.py: each model, whole in this process and
then split for tensor mode across the launch's ranks (`mlx_ring.tensor.cut`), on one prompt
and greedy decode steps.

For each `--model` (with its `--out` folder) every rank writes `started{r}`, then `refused{r}.txt`
(the ValueError that refuses the split, which every rank reaches alike), or `unrunnable{r}.txt`
(where mlx-lm's whole model fails in one process), or `error{r}.txt` (where the forward fails; the
launch goes on only where every rank failed alike), or `want.npy` (the whole model's logits: the
prompt's last row, then each greedy step's), `want.json` (its greedy tokens) and `got{r}.npy` (the
split model's, fed the whole model's tokens: its own greedy tokens are the rows' argmax as long as
they agree), `how{r}.txt` (shard() or layouts) and `share{r}.json` (its parameter bytes, the whole
model's, and its first layer's heads and MLP columns); then `done{r}`.
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
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from mlx_ring.ring.world import init_world
from mlx_ring.tensor.cut import cut, model_type
from mlx_ring.tensor.sums import summing


def logits_of(model, prompt: list[int], feed: list[int] | None, steps: int):
    """Rows of logits (the prompt's last, then one per step) and the greedy tokens; with `feed`,
    each step is fed feed's token instead of its own (and only the rows come back)."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    rows, tokens = [], []
    for i in range(steps):
        rows.append(np.array(logits.astype(mx.float32)))
        tokens.append(int(mx.argmax(logits).item()))
        logits = model(mx.array([[feed[i] if feed else tokens[-1]]]), cache=cache)[0, -1]
    return np.stack(rows) if feed else (np.stack(rows), tokens)


def run(folder: Path, out: Path, group, prompt: list[int], steps: int) -> None:
    r = group.rank()
    model = load_model(folder, lazy=True)[0]
    try:  # first, so that a refused type costs no forward
        how = cut(model, group, model_type(model), summing(group))
    except ValueError as e:
        (out / f"refused{r}.txt").write_text(str(e))
        return
    try:
        whole = load_model(folder)[0]
        want, want_tokens = logits_of(whole, prompt, None, steps)
        whole_bytes = _bytes(whole)
        del whole
    except Exception as e:  # noqa: BLE001 -- mlx-lm's own model fails: there is nothing to compare with
        (out / f"unrunnable{r}.txt").write_text(f"{type(e).__name__}: {e}")
        return
    if r == 0:
        np.save(out / "want.npy", want)
        (out / "want.json").write_text(json.dumps(want_tokens))
    mx.eval(model.parameters())
    got = logits_of(model, prompt, want_tokens, steps)
    np.save(out / f"got{r}.npy", got)
    (out / f"how{r}.txt").write_text(how)
    attn, mlp = (getattr(model.layers[0], x, None) for x in ("self_attn", "mlp"))
    share = {
        "bytes": _bytes(model),
        "whole": whole_bytes,
        "heads": getattr(attn, "n_heads", None),
        "kv_heads": getattr(attn, "n_kv_heads", None),
        "columns": getattr(getattr(mlp, "down_proj", None), "weight", np.zeros((0, 0))).shape[-1],
    }
    (out / f"share{r}.json").write_text(json.dumps(share))


def _bytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, nargs="+")
    p.add_argument("--out", required=True, nargs="+")
    p.add_argument("--prompt", required=True, nargs="+", help="a JSON list of token ids per model")
    p.add_argument("--steps", required=True, nargs="+", type=int, help="greedy steps per model")
    p.add_argument(
        "--stall",
        required=True,
        nargs="+",
        type=float,
        help="seconds each model may take on this rank",
    )
    a = p.parse_args()
    group = init_world()
    for folder, out, prompt, steps, stall in zip(
        a.model, a.out, a.prompt, a.steps, a.stall, strict=True
    ):
        out = Path(out)
        (out / f"started{group.rank()}").write_text("")
        faulthandler.dump_traceback_later(
            stall, exit=True, file=open(out / f"stack{group.rank()}.txt", "w")
        )
        failed = 0
        try:
            run(Path(folder), out, group, json.loads(prompt), steps)
        except Exception as e:  # noqa: BLE001 -- the reason this type is refused
            (out / f"error{group.rank()}.txt").write_text(
                f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
            failed = 1
        # An error raised while the forward's graph is built (most are: shapes) is raised on every
        # rank before any all_sum runs, and the launch can go on. Where only some ranks failed, the
        # others wait in the model's all_sum: this one then pairs with it, the sum is not [N, 0] or
        # [N, N], and the launch ends (or the watchdog ends it).
        agree = mx.distributed.all_sum(mx.array([1, failed]), group=group).tolist()
        faulthandler.cancel_dump_traceback_later()
        if agree not in ([group.size(), 0], [group.size(), group.size()]):
            sys.stderr.flush()
            os._exit(3)
        (out / f"done{group.rank()}").write_text("")


if __name__ == "__main__":
    main()
