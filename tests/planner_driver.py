"""Run under mlx.launch by test_planner_ring.py: plan exactly as server.py does (each rank's
capabilities, MLX_RING_CAPS, rank 0's hosts.json keys, one exchange), write each rank's plan to
`plan{r}.json`, then decode through the ring with that plan via ring_driver.py.

Usage: planner_driver.py --model M --out DIR -- <ring_driver.py arguments without --layers>
"""

import json
import sys
from pathlib import Path

import ring_driver  # noqa: E402

from mlx_ring.config import parse_config  # noqa: E402
from mlx_ring.planning.sizes import spec_from_folder  # noqa: E402
from mlx_ring.ring.world import init_world  # noqa: E402
from server import make_plan  # noqa: E402


def main():
    split = sys.argv.index("--")
    mine, rest = sys.argv[1:split], sys.argv[split + 1 :]
    model, out = Path(mine[mine.index("--model") + 1]), Path(mine[mine.index("--out") + 1])
    world = init_world()
    cfg, _ = parse_config(
        ["--model", str(model), "--cache-dir", str(out / "cache"), "--log-dir", str(out / "logs")]
    )
    plan, _, predicted = make_plan(cfg, spec_from_folder(model), world, model)
    (out / f"plan{world.rank()}.json").write_text(
        json.dumps({"ranges": plan.ranges, "strategy": plan.strategy, "predicted": predicted})
    )
    # ring_driver joins the world this process already holds, and runs the plan it is given.
    ring_driver.init_world = lambda: world
    sys.argv = [ring_driver.__file__, *rest, "--layers", ",".join(map(str, plan.sizes))]
    ring_driver.main()


if __name__ == "__main__":
    main()
