"""bench_targets.Target stops the server it started when the bench is sent SIGTERM (a `timeout`, a
job's end), as it does on a normal exit: the server runs in a session of its own, so nothing else
would stop it, and it would hold the machine's GPU and its port."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# a stand-in server: answers /v1/models, as a started target is polled for
SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

BENCH = """
import sys, time
from pathlib import Path
from tools.bench_targets import Target, free_port
Path("bench-results").mkdir(exist_ok=True)
port = free_port()
with Target("sigterm-test", [sys.executable, "-c", sys.argv[1], str(port)], {}, port, False) as t:
    print(t.proc.pid, flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited; its parent (the bench) is gone, so init reaps it
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sigterm_to_the_bench_stops_the_server_it_started():
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    server = int(bench.stdout.readline())
    try:
        assert alive(server)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(server), "the server outlived the bench"
    finally:
        bench.kill()
        if alive(server):
            os.killpg(server, signal.SIGKILL)
