"""A JACCL worker's deadlines (ring/deadline.py): a bounded wait past STEP_TIMEOUT names the rank
waited on; the wait for the next step's header is never timed (an idle ring is silent) until a
SIGTERM comes; and a SIGTERM is seen even while the main thread is stuck in native code, as a
rank spinning in JACCL's receive is (no Python signal handler runs there)."""

import re
import subprocess
import sys
import threading
import time

from mlx_ring.exits import RING_BROKEN as LEFT_CODE
from mlx_ring.launcher.failures import explain
from mlx_ring.ring.deadline import Deadlines


def test_only_bounded_waits_expire_and_each_names_what_it_waited_for():
    d = Deadlines(60)
    assert d.overdue(time.monotonic()) is None  # not waiting
    with d.waiting("the next step from rank 1", bounded=False):
        assert d.overdue(d.wait.since + 10_000) is None  # an idle ring: silent for hours is fine
        with d.waiting("rank 2 to take a step's header"):
            assert d.overdue(d.wait.since + 59) is None
            assert d.overdue(d.wait.since + 61) == (
                "waited 61 s for rank 2 to take a step's header, over STEP_TIMEOUT (60 s): the "
                "rank waited on is stopped, hung or unreachable"
            )
        assert d.wait.what == "the next step from rank 1"  # the outer wait again
        d.terminate(30)
        came = d.term[0]
        assert d.overdue(came + 29) is None
        assert d.overdue(came + 31) == (
            "was asked to stop (SIGTERM) and has waited 31 s since for the next step from "
            "rank 1, which did not come"
        )
    assert d.overdue(came + 1000) is None  # a step came: nothing is waited for


def test_the_thread_ends_an_overdue_wait_with_its_reason():
    said, gone = [], threading.Event()
    d = Deadlines(0.3, on_expire=lambda reason: (said.append(reason), gone.set()))
    d.start(quiet=30, watch_sigterm=False)
    with d.waiting("the payload of a DECODE step from rank 3"):
        assert gone.wait(30)
    assert re.match(
        r"waited \d+ s for the payload of a DECODE step from rank 3, over STEP_TIMEOUT", said[0]
    ), said


STUCK = """import ctypes, logging, signal, sys, threading, time
from mlx_ring.ring.deadline import Deadlines
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
d = Deadlines(3600)
d.start(quiet=float(sys.argv[1]))
# The rank's own handler, as ring/worker.serve_worker installs it: it cannot run while the main
# thread is in native code.
signal.signal(signal.SIGTERM, lambda *_: print("python handler ran", flush=True))
libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(256)
libc.pthread_mutex_init(mutex, None)
libc.pthread_mutex_lock(mutex)
main = threading.main_thread().ident


def ready():  # "waiting" only once the main thread is in native code: a SIGTERM before would run the handler
    while sys._current_frames()[main].f_lineno != LOCK_LINE:
        time.sleep(0.01)
    time.sleep(0.1)
    print("waiting", flush=True)


LOCK_LINE = sys._getframe().f_lineno + 3  # the line of the lock below
threading.Thread(target=ready, daemon=True).start()
with d.waiting("the next step from rank 0", bounded=False):
    libc.pthread_mutex_lock(mutex)  # locked already: native code that no signal ends
"""


def test_a_sigterm_ends_a_rank_stuck_in_native_code_once_its_peer_stays_silent(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    p = subprocess.Popen(
        [sys.executable, str(script), "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"MLX_RANK": "2", "PATH": "/usr/bin:/bin"},
    )
    try:
        assert p.stdout.readline() == "waiting\n"
        p.terminate()  # SIGTERM, as mlx.launch's stop script sends it
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == LEFT_CODE, err
    assert "python handler ran" not in out  # the main thread never came back to Python
    said = re.search(
        r"ring deadline: (rank 2 was asked to stop \(SIGTERM\) and has waited \d+ "
        r"s since for the next "
        r"step from rank 0, which did not come); leaving",
        err,
    )
    assert said, err
    assert explain(err) == [said.group(1)]  # the launcher names it when the ring exits
