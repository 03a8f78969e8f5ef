"""Run under mlx.launch by the model matrix (tests/ring/test_model_matrix.py): ring_driver's run for
each model, one after another in one launch, whether or not its type is admitted yet (the matrix is
what admits it). Before each model every rank marks it started; a rank whose model raises writes the
error beside its results and ends the launch, so the matrix can name the type and go on without it.
Started alone (a world of one rank: no ring to leave waiting), `--keep-going` goes on to the next
model, and first writes single-process mlx-lm's logits for each sequence (`want{i}.npy`,
`want.json`) and, for each of `--cuts`, why the model's cuts chained in this process differ from the
whole model (`cuts.json`): model code runs only in these processes, never in the test's, as a model
may corrupt its process.
"""

import faulthandler
import json
import os
import sys
import traceback
from pathlib import Path

import mlx.core as mx
import numpy as np
import ring_driver
from mlx_lm.utils import load_model
from ringutil import reference_logits

import mlx_ring.serving.runner as batching
import shard
from mlx_ring.models.slicing import Slice
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.world import init_world

shard.check_supported = lambda config: None  # the matrix decides what is supported


def main():
    a = ring_driver_args()
    world = init_world()
    ring = Ring(world)
    for model, out, sizes in zip(a.model, a.out, a.layers, strict=True):
        out = Path(out)
        (out / f"started{world.rank()}").write_text("")
        real = batching.sample_rows, batching.sample_lazy
        # A rank stuck in a model (waiting on a peer that will never send) says where,
        # and ends the launch.
        faulthandler.dump_traceback_later(
            a.stall, exit=True, file=open(out / f"stack{world.rank()}.txt", "w")
        )
        try:
            if a.keep_going:
                references(Path(model), out, json.loads(a.spec), a.cuts)
            ring_driver.run(a, world, ring, Path(model), out, sizes)
        # the ring cannot go on past a rank that failed mid-step: end the launch
        except Exception as e:
            (out / f"error{world.rank()}.txt").write_text(
                f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
            if a.keep_going and world.size() == 1:
                continue
            sys.stderr.flush()
            os._exit(3)
        finally:
            faulthandler.cancel_dump_traceback_later()
            batching.sample_rows, batching.sample_lazy = real
        (out / f"done{world.rank()}").write_text("")


def references(model: Path, out: Path, spec: list, cuts: list[str]) -> None:
    tokens, wants = [], []
    for i, s in enumerate(spec):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
        np.save(out / f"want{i}.npy", want)
        tokens.append(want_tokens)
        wants.append(want)
    (out / "want.json").write_text(json.dumps(tokens))
    (out / "cuts.json").write_text(
        json.dumps(
            {
                c: chained_cuts(model, [int(x) for x in c.split(",")], spec[0]["prompt"], wants[0])
                for c in cuts
            }
        )
    )


def chained_cuts(folder: Path, sizes: list[int], prompt: list[int], want: np.ndarray) -> str | None:
    """Why the model's cuts, chained in this process (embed, each rank's layers, head), differ from
    the whole model's logits `want` for one prompt and its cached decode steps, or None."""
    try:
        bounds = np.cumsum([0] + sizes).tolist()
        ring = []
        for r in range(len(sizes)):
            model = load_model(folder, lazy=True)[0]
            ring.append(Slice(model, bounds[r], bounds[r + 1], ends=r == 0))
            mx.eval(model.parameters())
        caches = [c.new_caches() for c in ring]

        def step(tokens):
            h = ring[0].embed(mx.array([tokens]))
            for c, kv in zip(ring, caches):
                h = c.forward(h, kv)
            return ring[0].head(h)[0, -1]

        logits, got = step(prompt), []
        for _ in range(len(want)):
            got.append(np.array(logits.astype(mx.float32)))
            logits = step([int(mx.argmax(logits).item())])
    except Exception as e:  # noqa: BLE001 -- the reason this type is refused
        return (
            f"{type(e).__name__}: {str(e).strip().splitlines()[0][:240] if str(e).strip() else ''}"
        )
    err = float(np.abs(np.stack(got) - want).max())
    return f"logits differ from the whole model's by {err}" if not err <= 1e-4 else None


def ring_driver_args():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, nargs="+")
    p.add_argument("--out", required=True, nargs="+")
    p.add_argument("--layers", required=True, nargs="+")
    p.add_argument("--spec", required=True)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--stall", type=float, default=30, help="seconds a model may take on this rank")
    p.add_argument(
        "--cuts", nargs="*", default=[], help="with --keep-going: layer counts to chain, e.g. 3,1"
    )
    p.add_argument(
        "--keep-going", action="store_true", help="alone (one rank): go on past a model that fails"
    )
    a = p.parse_args()
    a.prompt_cache, a.draft, a.draft_model, a.choose_groups, a.parallel = 0, 0, None, 0, "pipeline"
    a.block, a.disk, a.spoil, a.kv_bits = 16, None, [], 0  # no prompt cache: ring_driver's defaults
    json.loads(a.spec)
    return a


if __name__ == "__main__":
    main()
