"""What the ring serves at once is bound by the memory its hosts have for KV cache: a 2-rank
server whose rank 0 may use only enough memory for its slice and 800 tokens of cache. Two
requests that would need more together run one after the other, both whole; one that could never
fit is refused."""

import json
import threading
import time

import httpx
from serverutil import running_server

from mlx_ring.planning.assemble import serving
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import layer_kv_bytes, runtime_bytes
from mlx_ring.planning.plan import GIB
from mlx_ring.planning.sizes import spec_from_folder

ROOM = 800  # tokens of KV cache rank 0 has room for
EOS_OFF = {"2": -100}  # SmolLM2's end token: forbidden, so each answer runs as long as asked
CAPS = [
    {"host": "a", "device": "CPU", "memory_gb": 16, "tflops": 1.0, "bandwidth_gbs": 10.0},
    {"host": "b", "device": "CPU", "memory_gb": 16, "tflops": 1.0, "bandwidth_gbs": 10.0},
]


def test_requests_wait_for_room_in_the_kv_cache_and_one_that_cannot_fit_is_refused(
    tmp_path, default_model
):
    # as the ranks plan: PREFILL_CHUNK auto, MAX_ACTIVE 16
    spec = serving(spec_from_folder(default_model), 0, 16)
    half = spec.n_layers // 2
    runtime = runtime_bytes(spec, Capabilities("a", 16, 1, 1, 1, "CPU"), 0, half, 64)
    room_gb = (
        runtime + spec.ends_bytes + half * (spec.layer_bytes + layer_kv_bytes(spec, ROOM + 0.5))
    ) / GIB
    hostfile = tmp_path / "keys.json"
    hostfile.write_text(
        json.dumps(
            [
                {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "max_memory_gb": room_gb},
                {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]},
            ]
        )
    )
    env = {
        "MLX_RING_CAPS": json.dumps(CAPS),
        "HOSTFILE": str(hostfile),
        "KV_TOKENS": "64",
        "PROMPT_CACHE_GB": "0",
        "PROMPT_DISK_GB": "0",  # no prompt cache: its disk tier's buffers would take room too
        "LAYERS": f"{half},{spec.n_layers - half}",
    }
    with running_server(tmp_path, n_ranks=2, env=env) as (url, _):
        plan = httpx.get(f"{url}/cluster/status", timeout=30).json()["plan"]
        assert plan["kv_capacity_tokens"] == ROOM and plan["kv_tokens"] == 64, plan

        # Alone, a request's row needs prompt + 60 + 256 (the room a cache grows by), twice over
        # while it grows (the copy): it fits. Two need 2 x (prompt + 60 + 128), twice over: more
        # than 800, so the second waits for the first to finish.
        times: dict[int, list[float]] = {}
        answers: dict[int, dict] = {}

        def stream(i: int) -> None:
            body = {
                "messages": [{"role": "user", "content": f"Tell me story {i}."}],
                "max_tokens": 60,
                "stream": True,
                "temperature": 0,
                "logit_bias": EOS_OFF,
                "stream_options": {"include_usage": True},
            }
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        times.setdefault(i, []).append(time.monotonic())
                    if chunk.get("usage"):
                        answers[i] = chunk["usage"]

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        waited = 0
        # the one waiting for room shows in the status
        while any(t.is_alive() for t in threads) and not waited:
            waited = httpx.get(f"{url}/cluster/status", timeout=30).json()["waiting_prompts"]
        for t in threads:
            t.join(300)
        assert waited == 1
        assert all(answers[i]["completion_tokens"] == 60 for i in range(2)), answers  # both whole
        first, second = sorted(range(2), key=lambda i: times[i][0])
        assert times[second][0] > times[first][-1], (
            "the second request started while the first still held its room"
        )

        # prompt + max_tokens beyond what the ring holds for one request (800 / 2 - 256): a
        # 400, and nothing runs.
        r = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 140},
        )
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded", err
        assert "holds the KV cache of 144 tokens for one request" in err["message"], err
