"""A worker with JACCL's deadlines (ring/deadline.py), on a real 2-rank ring: its predecessor
sends a step's header and falls silent, and the worker leaves by itself, naming that rank and its
host, where nothing on the wire would ever tell it."""

import os
import re
import signal
import subprocess

from ringutil import ROOT, launch_cmd

from mlx_ring.launcher.failures import explain


def test_a_worker_leaves_naming_the_rank_that_stopped_mid_step(tmp_path):
    proc = subprocess.Popen(
        launch_cmd(2, tmp_path, [str(ROOT / "tests" / "deadline_driver.py")]),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    said = re.search(
        r"ring deadline: (rank 1 waited \d+ s for the payload of a DECODE step "
        r"from rank 0 \(mac-a\), "
        r"over STEP_TIMEOUT \(2 s\): the rank waited on is stopped, "
        r"hung or unreachable); leaving",
        out + err,
    )
    assert said, err[-3000:]
    assert "Node with rank 1 exited with code 75" in err  # mlx.launch then stops rank 0
    assert explain(out + err) == [said.group(1)]
