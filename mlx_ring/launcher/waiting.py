"""While the ring is down and the supervisor waits for a host: what it says about it. A state file
that `./launch.sh status` reads, and a stand-in on the API's port that answers every request with a
503 naming the host, since when and why (clients and load balancers see why, not a refused port)."""

import json
import logging
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

POLL_S = 3  # how often a host that went away is tried again: it serves again soon after it is back
REMIND_S = 120  # how often the log says again what the supervisor still waits for

log = logging.getLogger("launcher")


def write_state(path: Path, state: str, **facts) -> dict:
    """The supervisor's state (serving, waiting, stopped, ...) with `since` and
    whatever else it knows."""
    row = {"state": state, "since": time.time(), **facts}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(row))
    tmp.replace(path)  # readers never see half a file
    return row


def read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def describe(state: dict, now: float | None = None) -> str:
    """One sentence for a person: what the ring waits for, since when, and why."""
    ago = (now or time.time()) - state["since"]
    when = f"since {time.strftime('%H:%M:%S', time.localtime(state['since']))} ({ago:.0f} s)"
    if state["state"] == "waiting":
        return (
            f"the ring is down, waiting for {', '.join(state['hosts'])} {when}: {state['why']}; it "
            "restarts by itself once they answer"
        )
    if state["state"] == "failed_over":
        return (
            f"serving without {', '.join(state['hosts'])} {when}: {state['why']}; it is taken "
            "back once it answers"
        )
    return f"the ring is {state['state']} {when}" + (
        f": {state['why']}" if state.get("why") else ""
    )


def reachable(conf: Path, host: str, timeout: int = POLL_S) -> bool:
    """Whether `host` takes an ssh session now (a few seconds at most)."""
    try:
        p = subprocess.run(
            ["ssh", "-F", str(conf), "-o", f"ConnectTimeout={timeout}", host, "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout + 5,
        )
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0


def still_waiting(hosts: list[str], waited_s: float, why: str) -> str:
    """The log's reminder while a host stays away without a word: what the ring waits for, and what
    brings a host back (a Mac asleep answers no ssh until something wakes it)."""
    return (
        f"still waiting for {', '.join(hosts)} after {waited_s / 60:.0f} min ({why}); it answers "
        "no ssh: is it off, asleep or off the network? Wake a sleeping Mac (a key, its power "
        "button), and keep it awake with `sudo pmset -a sleep 0 womp 1 autorestart 1` there; the "
        "ring restarts by itself once it answers, `./launch.sh stop` gives up"
    )


def wait_for(
    conf: Path,
    hosts: list[str],
    why: str,
    stopping: threading.Event,
    give_up=lambda: False,
    remind_s: float = REMIND_S,
    poll_s: float = POLL_S,
    back=None,
) -> None:
    """Until every one of `hosts` is back (takes ssh, or `back(host)` says so), `stopping` is set
    or `give_up()` says so, trying every `poll_s`; every `remind_s` the log says again what it
    waits for (a supervisor in the background must not wait in silence)."""
    back = back or (lambda h: reachable(conf, h))
    t0 = last = time.monotonic()
    while not stopping.is_set() and not all(back(h) for h in hosts) and not give_up():
        if time.monotonic() - last >= remind_s:
            last = time.monotonic()
            log.info("%s", still_waiting(hosts, last - t0, why))
        stopping.wait(poll_s)


class DownServer:
    """A 503 on every path of the API's address while the ring is down (`with DownServer(...)`);
    /health carries the state. Quietly absent when the port cannot be had."""

    def __init__(self, host: str, port: int, state_file: Path, tls: tuple[str, str] | None = None):
        self.address, self.state_file, self.tls, self.server = (host, port), state_file, tls, None

    def __enter__(self):
        state_file = self.state_file

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                state = read_state(state_file) or {"state": "restarting", "since": time.time()}
                said = describe(state)
                if self.path.split("?")[0] == "/health":
                    body = {"status": state["state"], "detail": said, **state}
                else:  # OpenAI's error shape, as the ring's own 503s
                    body = {
                        "error": {
                            "message": said,
                            "type": "service_unavailable",
                            "param": None,
                            "code": None,
                        }
                    }
                data = json.dumps(body).encode()
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", str(POLL_S))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *_):  # the supervisor's log says what matters, once
                pass

        try:
            self.server = ThreadingHTTPServer(self.address, Handler)
        except OSError:
            return self  # the port is taken (a rank 0 still leaving): nothing to stand in for
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        ).start()
        return self

    def __exit__(self, *_):
        if self.server:
            self.server.shutdown()
            self.server.server_close()  # the port is free for rank 0 again
