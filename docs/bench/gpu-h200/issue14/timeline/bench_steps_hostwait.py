"""bench_steps with every rank waiting for a payload's bytes on the host (select) before evaluating
the graph that receives it, as on a CPU: no GPU wait kernel spins while the previous rank computes."""
import runpy, sys
sys.path.insert(0, "tools")
from mlx_ring.gpu import one_gpu_per_rank
one_gpu_per_rank()
import mlx_ring.ring.transport as t
_init = t.Ring.__init__
def init(self, world):
    _init(self, world)
    self.wait_in_kernel = True
t.Ring.__init__ = init
sys.argv = ["tools/bench_steps.py"] + sys.argv[1:]
runpy.run_path("tools/bench_steps.py", run_name="__main__")
