"""Run under mlx.launch by test_planner_ring.py: plan exactly as server.py does (each rank's
capabilities, MLX_RING_CAPS, rank 0's hosts.json keys, one exchange), write each rank's plan to
`plan{r}.json`, then decode through the ring with that plan via ring_probe.py.

Usage: planner_probe.py --model M --out DIR -- <ring_probe.py arguments without --layers>
"""

import json
import sys
from pathlib import Path


import ring_probe  # noqa: E402
from mlx_ring.config import parse_config  # noqa: E402
from server import make_plan  # noqa: E402
from mlx_ring.ring.transport import init_group  # noqa: E402


def main():
    split = sys.argv.index("--")
    mine, rest = sys.argv[1:split], sys.argv[split + 1:]
    model, out = Path(mine[mine.index("--model") + 1]), Path(mine[mine.index("--out") + 1])
    group = init_group()
    cfg, _ = parse_config(["--model", str(model), "--cache-dir", str(out / "cache"), "--log-dir", str(out / "logs")])
    plan, predicted = make_plan(cfg, model, group)
    (out / f"plan{group.rank()}.json").write_text(json.dumps({"ranges": plan.ranges, "strategy": plan.strategy,
                                                               "predicted": predicted}))
    # ring_probe joins the group this process already holds, and runs the plan it is given.
    ring_probe.init_group = lambda: group
    sys.argv = [ring_probe.__file__, *rest, "--layers", ",".join(map(str, plan.sizes))]
    ring_probe.main()


if __name__ == "__main__":
    main()
