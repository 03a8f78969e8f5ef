"""Run under mlx.launch by the tests: push a prompt and greedy decode steps through the real ring.

Every rank writes `rank{r}.json` (its layer range, parameter bytes, resident memory); rank 0 also
writes `logits.npy` (one row per step) and `tokens.json`.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from generate import Pipeline  # noqa: E402
from plan import plan_from_sizes, uniform_plan  # noqa: E402
from shard import Ring, init_group, load_shard, rss_kib, serve_worker  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", required=True, help="comma-separated token ids")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", default=None)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    group = init_group()
    rank, size = group.rank(), group.size()
    n_layers = json.loads((Path(a.model) / "config.json").read_text())["num_hidden_layers"]
    plan = plan_from_sizes(n_layers, [int(x) for x in a.layers.split(",")]) if a.layers else uniform_plan(n_layers, size)
    shard = load_shard(Path(a.model), plan, rank)
    out = Path(a.out)
    info = shard.info() | {"rss_kib": rss_kib(), "size": size}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    ring = Ring(group)
    if rank != 0:
        return serve_worker(shard, ring)
    pipe = Pipeline(shard, ring)
    prompt = [int(t) for t in a.prompt.split(",")]
    rows, tokens = [], []
    logits = pipe.logits(1, prompt, 0)
    for step in range(a.steps):
        rows.append(np.array(logits.astype(mx.float32)))
        tokens.append(int(mx.argmax(logits).item()))
        logits = pipe.logits(1, [tokens[-1]], len(prompt) + step)
    pipe.free(1)
    status = pipe.status()
    np.save(out / "logits.npy", np.stack(rows))
    (out / "tokens.json").write_text(json.dumps({"tokens": tokens, "status": status}))
    pipe.shutdown()


if __name__ == "__main__":
    main()
