"""No request can take the ring down: generated bodies for every field against the running 2-rank
server, a huge prompt while another client streams, a slow stage on rank 0, and a ring whose sockets
hold less than one decode step's payload. After each, the same rank processes still serve.

The same generated bodies meet the app in process 300 at a time
(tests/unit/api/test_openai_errors.py): which are answered and how the others are refused is the
app's. Here fewer go to a real ring, enough that bodies the app lets through reach the real engine
and sampling. FUZZ_EXAMPLES (default 80) sets how many."""

import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from fuzzbodies import MODEL, bodies
from hypothesis import HealthCheck, given, settings
from serverutil import running_server

from tools.random_model import make_random_model

EOS_OFF = {"2": -100}  # SmolLM2's end token: forbid it so a request runs as long as asked


@pytest.fixture(scope="module")
def ring(tmp_path_factory, default_model):
    # 29 layers on rank 0 and 1 on rank 1, with a short step timeout: rank 0's own stage takes
    # seconds for a long prompt, rank 1's a fraction of that; only rank 1's counts as a wait.
    tmp = tmp_path_factory.mktemp("ring")
    args = [
        "--layers",
        "29,1",
        "--step-timeout",
        "2",
        "--prefill-chunk",
        "4096",
        "--max-tokens",
        "2",
        "--max-tokens-limit",
        "64",
    ]
    with running_server(tmp, n_ranks=2, extra_args=args) as (url, proc):
        yield Ring(url, proc, tmp / "logs")


class Ring:
    def __init__(self, url, proc, logs):
        self.url, self.proc, self.logs = url, proc, logs
        self.pids = self.rank_pids()

    def rank_pids(self) -> list[int]:
        return [int((self.logs / f"rank{r}.pid").read_text()) for r in range(2)]

    def assert_unharmed(self, case=None):
        """Still the same rank processes, all alive, and the ring answers a round trip."""
        assert self.proc.poll() is None, f"the ring exited after {case!r}"
        assert self.rank_pids() == self.pids, f"the ring restarted after {case!r}"
        for pid in self.pids:
            os.kill(pid, 0)
        r = httpx.get(f"{self.url}/health", timeout=30)
        assert r.status_code == 200, (case, r.text)


def send(url: str, path: str, body: dict) -> httpx.Response:
    # NaN and Infinity go out as Python's json writes them, as some clients do
    content = json.dumps(body)
    with httpx.stream("POST", url + path, content=content, timeout=120) as r:
        r.read()
    return r


def test_generated_requests_never_harm_the_ring(ring):
    counts = {}

    @settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", "80")),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies())
    def case(path_body):
        path, body = path_body
        r = send(ring.url, path, body)
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        assert r.status_code in (200, 400, 404), (path, body, r.status_code, r.text[:500])
        if r.status_code != 200:
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"], r.text
        elif body.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, (
                body,
                r.text[-500:],
            )
        ring.assert_unharmed((path, body))

    case()
    print("status counts:", counts)
    assert counts.get(200) and counts.get(400)  # both kinds were exercised


def test_the_event_loop_streams_while_huge_and_misshapen_prompts_arrive(ring):
    client = openai.OpenAI(base_url=f"{ring.url}/v1", api_key="none", max_retries=0, timeout=120)
    arrivals = []

    def consume():
        for c in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to fifty."}],
            max_tokens=60,
            logit_bias=EOS_OFF,
            stream=True,
        ):
            if c.choices and c.choices[0].delta.content:
                arrivals.append(time.monotonic())

    streaming = threading.Thread(target=consume)
    streaming.start()
    while len(arrivals) < 3:
        assert streaming.is_alive(), "the stream ended before the huge prompts went out"
        time.sleep(0.02)
    # ~110k tokens
    huge = {
        "messages": [
            {"role": "user", "content": "hello world, this is a test of many tokens. " * 10000}
        ]
    }
    t0 = time.monotonic()
    # 7.5 MB of the wrong shape: read in a worker process
    wrong = json.dumps({"messages": [1] * 2_500_000})
    with ThreadPoolExecutor(12) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(f"{ring.url}/v1/chat/completions", json=huge, timeout=120),
                range(12),
            )
        )
        misshapen = list(
            pool.map(
                lambda _: httpx.post(f"{ring.url}/v1/chat/completions", content=wrong, timeout=120),
                range(2),
            )
        )
    t1 = time.monotonic()
    streaming.join(120)
    assert all(
        a.status_code == 400 and a.json()["error"]["code"] == "context_length_exceeded"
        for a in answers
    )
    assert all(
        a.status_code == 400
        and a.json()["error"]["message"].startswith("messages.0: Input should be")
        for a in misshapen
    )
    # Tokens kept arriving while the 12 prompts were tokenized: no gap in the stream came near the
    # time they took (tokenizing on the event loop froze every stream for all of it).
    during = [t0] + [t for t in arrivals if t0 < t < t1] + [t1]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert max(gaps) < (t1 - t0) / 2, (
        f"largest gap {max(gaps):.2f} s in {t1 - t0:.2f} s of tokenizing"
    )
    ring.assert_unharmed("huge prompts")


def test_a_slow_stage_on_rank_0_is_not_taken_for_a_hung_rank(ring):
    # ~1000 prompt tokens in one chunk: rank 0's 29 layers take seconds on a CPU, more than the 2 s
    # step timeout; rank 1's single layer takes a fraction of that.
    t0 = time.monotonic()
    r = httpx.post(
        f"{ring.url}/v1/completions", json={"prompt": "word " * 1000, "max_tokens": 1}, timeout=300
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] >= 1000
    print(f"a 1000-token prompt took {time.monotonic() - t0:.1f} s")
    ring.assert_unharmed("long prompt")


def test_small_socket_buffers_do_not_deadlock_64_streams(tmp_path, default_model):
    # Hidden size 2048, float32: a decode step of 64 rows carries 512 KiB (in one group, or two of
    # 256 KiB), and the ring's sockets hold 32 KiB (Linux books twice that). A sender blocks until
    # its peer reads, as over a real link with small buffers. (At 16 KiB, TCP's delayed
    # acknowledgements stretch each transfer to about a second, and the test to over a minute; at 4
    # KiB, to seconds a transfer.)
    model = make_random_model(
        "qwen3-1.7b",
        tmp_path / "wide",
        default_model,
        "float32",
        num_hidden_layers=2,
        intermediate_size=256,
    )
    args = [
        "--model",
        str(model),
        "--max-active",
        "64",
        "--max-tokens-limit",
        "8",
        "--step-timeout",
        "30",
    ]
    with running_server(
        tmp_path, n_ranks=2, extra_args=args, env={"RING_SOCKET_BUFFER": "32768"}
    ) as (url, proc):
        wide = Ring(url, proc, tmp_path / "logs")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)

        def one(i):
            r = client.chat.completions.create(
                model=model.name,
                messages=[{"role": "user", "content": f"Story number {i}" + " go" * (i % 7)}],
                max_tokens=6,
                logit_bias=EOS_OFF,
                temperature=0,
            )
            return r.usage.completion_tokens

        with ThreadPoolExecutor(64) as pool:
            assert list(pool.map(one, range(64))) == [6] * 64
        wide.assert_unharmed("64 streams")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # user + system


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="reads rank 0's CPU time from /proc/<pid>/stat, which only Linux has",
)
def test_rank_0_waits_idle_on_a_stopped_rank_then_reports_it(tmp_path, default_model):
    # Rank 1 holds most layers, so a stop most likely lands while rank 0 waits for a step's
    # hidden states whose header has come: MLX's own receive then polls a core until the timeout.
    args = ["--layers", "2,28", "--step-timeout", "6"]
    with running_server(tmp_path, n_ranks=2, extra_args=args) as (url, proc):
        rank0, rank1 = [int((tmp_path / "logs" / f"rank{r}.pid").read_text()) for r in range(2)]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count to a thousand."}],
            max_tokens=400,
            logit_bias=EOS_OFF,
            stream=True,
        )
        for _ in range(4):
            next(stream)  # generating
        try:
            os.kill(rank1, signal.SIGSTOP)
            cpu0, t0 = cpu_seconds(rank0), time.monotonic()
            with pytest.raises(openai.APIError, match=r"rank 1 \(.*did no step for 6 s: the rank"):
                for _ in stream:
                    pass
            # rank 0 lingers a second to send errors
            cpu1, t1 = cpu_seconds(rank0), time.monotonic()
        finally:
            os.kill(rank1, signal.SIGKILL)
        assert t1 - t0 < 10
        assert cpu1 - cpu0 < 0.25 * (t1 - t0), (
            f"rank 0 used {cpu1 - cpu0:.1f} s of CPU in {t1 - t0:.1f} s of waiting"
        )


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie its parent has not reaped yet."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="reads process states from /proc, which only Linux has",
)
def test_a_sigtermed_worker_leaves_a_predecessor_that_went_silent(tmp_path, default_model):
    # Rank 0 stopped holds its sockets open and sends nothing, as a host that lost power would:
    # its successor, asked to stop, leaves after DRAIN_TIMEOUT seconds of silence instead of
    # waiting for a SIGKILL.
    quiet = 6
    with running_server(tmp_path, n_ranks=2, extra_args=["--drain-timeout", str(quiet)]) as (
        url,
        proc,
    ):
        rank0, rank1 = [int((tmp_path / "logs" / f"rank{r}.pid").read_text()) for r in range(2)]
        try:
            os.kill(rank0, signal.SIGSTOP)
            os.kill(rank1, signal.SIGTERM)
            time.sleep(quiet / 2)
            assert not gone(rank1), "a SIGTERM alone must not cut the ring under rank 0's drain"
            deadline = time.monotonic() + quiet + 30
            while not gone(rank1) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert gone(rank1), (
                "rank 1 still waits on a silent rank 0 "
                f"{quiet + 30 + quiet / 2:.0f} s after its SIGTERM"
            )
        finally:
            os.kill(rank0, signal.SIGKILL)
