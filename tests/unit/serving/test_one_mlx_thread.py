"""Only the engine's thread calls MLX: a GPU's error is raised in the thread that meets it, and MLX
keeps its streams per thread. Every function of mlx.core and every method of mx.array is wrapped
to note the thread that calls it, while the real app serves the real engine (one rank of a tiny
random model, in process) with a prompt cache in RAM and on disk: chat completions (streamed,
constrained by a grammar, and a prompt whose blocks come back from the disk), /health's step
round the ring, /metrics and /cluster/status. The HTTP side, its tokenizer pool, the disk's
writer and readers and the engine's watchdog call none of it."""

import threading
import types

import mlx.core as mx
import pytest
from apiutil import client, served_model
from mlx_lm.utils import load_tokenizer
from ringutil import make_tiny_model

from mlx_ring.cache import tiers
from mlx_ring.cache.disk import DiskTier
from mlx_ring.cache.held import HeldBlocks
from mlx_ring.planning.plan import uniform_plan
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.transport import Ring
from mlx_ring.serving.engine import Engine
from mlx_ring.serving.scheduler import Scheduler
from shard import load_shard

BLOCK = 16


@pytest.fixture
def callers(monkeypatch):
    """(thread name, what it called) for every MLX call while `on` is set."""
    calls, on = [], threading.Event()

    def noted(name, fn):
        def call(*args, **kwargs):
            if on.is_set():
                calls.append((threading.current_thread().name, name))
            return fn(*args, **kwargs)

        return call

    modules = [mx, *(v for v in vars(mx).values() if isinstance(v, types.ModuleType))]
    for module in modules:
        for name, fn in list(vars(module).items()):
            if type(fn).__name__ == "nb_func":
                monkeypatch.setattr(module, name, noted(f"{module.__name__}.{name}", fn))
    for name, fn in list(vars(mx.array).items()):
        if type(fn).__name__ == "nb_method" and (
            not name.startswith("__") or name in ("__getitem__", "__setitem__", "__array__")
        ):
            monkeypatch.setattr(mx.array, name, noted(f"array.{name}", fn))
    return calls, on


def test_no_thread_but_the_engines_calls_mlx(callers, default_model, tmp_path):
    calls, on = callers
    tiny = make_tiny_model(tmp_path / "model", "llama", vocab_size=49152)
    tokenizer = load_tokenizer(default_model)
    shard = load_shard(tiny, uniform_plan(7, 1), 0)
    shard.held = HeldBlocks(0)
    shard.held.salt = tiers.salt("tiny", BLOCK)
    scope = tiers.scope(shard.held.salt, (0, 7), (0, 1), "float32")
    shard.held.disk = DiskTier(tmp_path / "disk", scope, 1 << 30, floor_bytes=0)
    # RAM for two blocks: a prompt's others go to disk, and come back from it
    index = tiers.block_index(2 * BLOCK, shard.held.salt, BLOCK, shard.held.disk)
    served = served_model(default_model, tokenizer)
    sched = Scheduler(Pipeline(shard, Ring(mx.distributed.init())), shard, prefix=index)
    engine = Engine(sched, tokenizer, constrain=served.grammars.processor)
    thread = threading.Thread(target=engine.run, name="engine", daemon=True)
    long = " ".join(f"word{i}" for i in range(150))
    chat = {"max_tokens": 4, "temperature": 0.0}
    on.set()
    thread.start()
    try:
        with client(engine, served) as http:
            for body in (
                {"messages": [{"role": "user", "content": long}]},
                {"messages": [{"role": "user", "content": long}], "stream": True},
                {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "logprobs": True,
                    "top_logprobs": 2,
                    "response_format": {"type": "json_object"},
                },
            ):
                r = http.post("/v1/chat/completions", json=body | chat)
                assert r.status_code == 200, r.text
            for route in ("/health", "/metrics", "/cluster/status"):
                assert http.get(route).status_code == 200, route
        assert engine.stats().prompt_cache.disk_hit_tokens > 0  # the disk's readers read
    finally:
        engine.stop()
        thread.join(60)
        shard.held.disk.close()  # its writer finishes the queue
        on.clear()
    threads = {t for t, _ in calls}
    assert "engine" in threads, "no MLX call was seen at all"
    assert threads == {"engine"}, sorted({c for c in calls if c[0] != "engine"})
