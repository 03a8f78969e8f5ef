"""The ring driver's runs (tests/ring_driver.py under mlx.launch) and their results read back, and
single-process mlx-lm's greedy tokens to hold them to."""

import functools
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model
from ringutil import ROOT, launch

DRIVER = str(ROOT / "tests" / "ring_driver.py")


def run_probe(
    tmp_path,
    n,
    model,
    spec,
    layers=None,
    groups=1,
    chunk=512,
    timeout=300,
    prompt_cache=0,
    draft=0,
    draft_model=None,
    outs=None,
    choose_groups=0,
    parallel="pipeline",
    cases=None,
):
    """Run the scheduler on n ranks; returns (tokens per sequence, logits per sequence,
    status, rank infos). `model` a list (and `outs` a folder for each): the models one after
    another in one launch; returns the first one's results (read the others with
    `read_probe`); `cases`: each model's own settings over the arguments (ring_driver's
    --case: a dict of its flags' names)."""
    models, outs = (model, outs) if isinstance(model, list) else ([model], [tmp_path])
    argv = [
        DRIVER,
        "--model",
        *map(str, models),
        "--spec",
        json.dumps(spec),
        "--groups",
        str(groups),
        "--chunk",
        str(chunk),
        "--out",
        *map(str, outs),
        "--prompt-cache",
        str(prompt_cache),
        "--draft",
        str(draft),
        "--choose-groups",
        str(choose_groups),
        "--parallel",
        parallel,
    ]
    argv += ["--draft-model", str(draft_model)] if draft_model else []
    argv += ["--case", *map(json.dumps, cases)] if cases else []
    if layers:
        argv += ["--layers", *([layers] if isinstance(layers, str) else [x or "-" for x in layers])]
    launch(n, tmp_path, argv, timeout=timeout)
    return read_probe(outs[0], n, spec)


def read_probe(out_dir, n, spec):
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(n)]
    out = json.loads((out_dir / "result.json").read_text())
    logits = [
        np.load(f) if (f := out_dir / f"logits{i}.npy").exists() else None for i in range(len(spec))
    ]
    return out["tokens"], logits, out["status"], ranks


def alone(model_path, prompt, n):
    """Greedy tokens of single-process mlx_lm for one sequence on its own."""
    return list(_alone(str(model_path), tuple(prompt), n))


@functools.lru_cache(maxsize=None)  # tests ask for the same prompts of the same model again
def _alone(model_path: str, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    model = _model(model_path)
    return tuple(
        int(t)
        for t, _ in zip(
            (tok for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n)), range(n)
        )
    )


@functools.lru_cache(maxsize=2)
def _model(model_path: str):
    return load_model(Path(model_path))[0]
