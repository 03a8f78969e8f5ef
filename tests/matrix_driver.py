"""Run under mlx.launch by the model matrix (tests/ring/test_model_matrix.py): ring_driver's run for
each model, one after another in one launch, whether or not its type is admitted yet (the matrix is
what admits it). Before each model every rank marks it started; a rank whose model raises writes the
error beside its results and ends the launch, so the matrix can name the type and go on without it.
Started alone (a world of one rank: no ring to leave waiting), `--keep-going` goes on to the next model.
"""

import json
import os
import sys
import traceback
from pathlib import Path

import ring_driver
import shard
import mlx_ring.serving.scheduler as batching
from mlx_ring.ring.transport import Ring, init_world

shard.check_supported = lambda config: None  # the matrix decides what is supported


def main():
    a = ring_driver_args()
    world = init_world()
    ring = Ring(world)
    for model, out, sizes in zip(a.model, a.out, a.layers, strict=True):
        out = Path(out)
        (out / f"started{world.rank()}").write_text("")
        real = batching.sample_rows, batching.sample_lazy
        try:
            ring_driver.run(a, world, ring, Path(model), out, sizes)
        except Exception as e:  # the ring cannot go on past a rank that failed mid-step: end the launch
            (out / f"error{world.rank()}.txt").write_text(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            if a.keep_going and world.size() == 1:
                continue
            sys.stderr.flush()
            os._exit(3)
        finally:
            batching.sample_rows, batching.sample_lazy = real
        (out / f"done{world.rank()}").write_text("")


def ring_driver_args():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, nargs="+")
    p.add_argument("--out", required=True, nargs="+")
    p.add_argument("--layers", required=True, nargs="+")
    p.add_argument("--spec", required=True)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--keep-going", action="store_true", help="alone (one rank): go on past a model that fails")
    a = p.parse_args()
    a.prompt_cache, a.draft, a.draft_model = 0, 0, None
    json.loads(a.spec)
    return a


if __name__ == "__main__":
    main()
