"""Claude Code's captured request, sent as Claude Code sends it (a billing line that changes every
turn), through the real app and engine on a one-rank ring of a tiny model under the tools template:
with the RAM tier under a tenth of the prompt, the second turn reuses every full block of the first
(RAM, then disk); after a restart (a new engine, the same disk) they come back from disk, and the
next turn reports its whole earlier prompt but the last token as cached."""

import copy
import json
import threading
from pathlib import Path

import mlx.core as mx
import pytest
from apiutil import client
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

CAPTURE = Path(__file__).parents[2] / "data" / "clients" / "claude_code_2.1_messages.json"
BLOCK = 256
TOOLS = 3  # of its 24: a prompt of a few thousand tokens, which a CPU prefills in seconds


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agent") / "model"
    return make_tiny_model(folder, "llama", vocab_size=49152)


@pytest.fixture(scope="module")
def world():
    return mx.distributed.init()  # a world of one: started without mlx.launch


def start(tiny, world, tokenizer, disk_dir: Path, ram_tokens: int):
    """A fresh engine: RAM empty, the disk tier over `disk_dir` as a restarted rank finds it."""
    shard = load_shard(tiny, uniform_plan(7, 1), 0)
    shard.held = HeldBlocks(0)
    shard.held.salt = tiers.salt("tiny", BLOCK)
    scope = tiers.scope(shard.held.salt, (0, 7), (0, 1), "float32")
    shard.held.disk = DiskTier(disk_dir, scope, 1 << 30, floor_bytes=0)
    index = tiers.block_index(ram_tokens, shard.held.salt, BLOCK, shard.held.disk)
    sched = Scheduler(Pipeline(shard, Ring(world)), shard, chunk=512, prefix=index)
    engine = Engine(sched, tokenizer)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    return engine, thread, shard


def stop(engine, thread, shard) -> None:
    engine.stop()
    thread.join(60)
    shard.held.disk.close()


def turns(engine, served, cchs) -> list[dict]:
    """The usage of the captured body sent once per billing-line value in `cchs`."""
    sent = json.loads(CAPTURE.read_text())
    first = sent["body"]["system"][0]["text"]
    sent["body"]["tools"] = sent["body"]["tools"][:TOOLS]
    out = []
    with client(engine, served, context_length=131072, aliases=("claude-*",)) as http:
        for cch in cchs:
            body = copy.deepcopy(sent["body"]) | {"max_tokens": 4, "stream": False}
            body["system"][0]["text"] = first + f" cch={cch};"
            r = http.post(sent["path"], json=body, headers=sent["headers"])
            assert r.status_code == 200, r.text
            out.append(r.json()["usage"])
    return out


def test_claude_code_turns_reuse_the_earlier_prompt_from_ram_and_disk_and_after_a_restart(
    tiny, world, tool_served, tmp_path
):
    # the RAM tier under a tenth of the prompt: the disk gives what RAM cannot hold
    engine, thread, shard = start(tiny, world, tool_served.tokenizer, tmp_path, BLOCK)
    try:
        one, two = turns(engine, tool_served, ["1f2e3", "9a8b7"])
        stats = engine.stats().prompt_cache
    finally:
        stop(engine, thread, shard)
    prompt = one["input_tokens"] + one["cache_read_input_tokens"]
    assert prompt > 10 * BLOCK and one["cache_read_input_tokens"] == 0
    assert two["input_tokens"] + two["cache_read_input_tokens"] == prompt
    whole = (prompt - 1) // BLOCK * BLOCK  # the full blocks before the last token
    assert two["cache_read_input_tokens"] == whole == stats.disk_hit_tokens + BLOCK

    # restarted with room for it all: the blocks come back from disk, then the tail from RAM
    engine, thread, shard = start(tiny, world, tool_served.tokenizer, tmp_path, 1 << 20)
    try:
        three, four = turns(engine, tool_served, ["77aa1", "5c5c5"])
        stats = engine.stats().prompt_cache
    finally:
        stop(engine, thread, shard)
    assert three["cache_read_input_tokens"] == whole == stats.disk_hit_tokens
    assert four["cache_read_input_tokens"] == prompt - 1
