"""The prompt cache as the layer plan counts it (planning/promptcache.py): each rank's RAM tier is
half of what the split leaves it beside its weights, runtime and KV_TOKENS' reserve, at most
PROMPT_CACHE_GB, after the disk tier's write queue and restore staging; rank 0's index holds as
many tokens as the tightest rank; and `./launch.sh plan` shows each tier. Pure: no MLX."""

import json

import pytest
from modeshapes import LLAMA_CONFIG

from mlx_ring.cache.kvbits import KVBits
from mlx_ring.cache_sizes import WRITE_QUEUE_BYTES, disk_folder, disk_here, packed_share
from mlx_ring.config import parse_config
from mlx_ring.planning.assemble import plan_for
from mlx_ring.planning.auto import plan_mode
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import kv_room
from mlx_ring.planning.modes import DEFAULT_ALLSUM
from mlx_ring.planning.plan import GIB, ModelSpec, plan_from_sizes, tensor_plan
from mlx_ring.planning.promptcache import Blocks, format_disk, set_aside
from mlx_ring.planning.report import format_summary, summary
from mlx_ring.planning.split import even_sizes

# 4 layers of 1 GiB, ends of 0.5 GiB, 128 KiB of KV a layer per token (1 GiB a layer for 8192
# tokens), no activations: a rank's need is its weights and KV reserve alone
SPEC = ModelSpec(4, GIB, GIB / 2, GIB / 2, 2**17, GIB, 1e9)
BIG, SMALL = Capabilities("big", 16, 10, 10, 400), Capabilities("small", 8, 6, 10, 400)
HALVES = plan_from_sizes(4, [2, 2])
DISK = Blocks(disk=True)


def test_the_ram_tier_is_half_of_what_the_split_leaves_and_the_tightest_rank_binds():
    # rank 0 needs 0.5 + 2 x (1 + 1) = 4.5 GiB of its 10, rank 1 4 of its 6
    caps, kept = set_aside(SPEC, [BIG, SMALL], HALVES, 8192, None)
    assert kept == [2.75, 1.0]
    assert [c.usable_gb for c in caps] == [7.25, 5.0]
    # what is left stays KV room: KV_TOKENS and as many tokens again as rank 1's RAM tier holds
    assert kv_room(SPEC, caps, HALVES, 8192) == 8192 + 4096
    s = summary(SPEC, caps, HALVES, 8192, kept=kept, blocks=Blocks(), ram_cap_gb=None)
    assert [r["prompt_cache_tokens"] for r in s["ranks"]] == [11264, 4096]
    assert s["prompt_cache"]["ram_tokens"] == 4096
    # a rank's memory is again what it may fill, and its figure counts its RAM tier
    assert [r["usable_gb"] for r in s["ranks"]] == [10.0, 6.0]
    assert s["ranks"][1]["most_gb"] == pytest.approx(6.0, abs=1e-3)


def test_prompt_cache_gb_caps_each_rank_and_zero_turns_the_ram_tier_off():
    assert set_aside(SPEC, [BIG, SMALL], HALVES, 8192, 2.0)[1] == [2.0, 1.0]
    caps, kept = set_aside(SPEC, [BIG, SMALL], HALVES, 8192, 0.0)
    assert kept == [0.0, 0.0] and caps == [BIG, SMALL]


def test_the_disk_tiers_write_queue_and_restore_staging_come_first():
    """A disk tier's write queue (256 MiB) and the blocks of a KV_TOKENS prompt read back from
    disk come out of what the split leaves; a rank they leave short has less KV room than
    KV_TOKENS."""
    queue = WRITE_QUEUE_BYTES / GIB
    caps, kept = set_aside(SPEC, [BIG, SMALL], HALVES, 8192, None, DISK)
    # staging: 8192 tokens of 2 layers' blocks, 2 GiB; rank 0 has 5.5 left, rank 1 only 2
    assert kept == [pytest.approx((5.5 - queue - 2) / 2), 0.0]
    assert caps[1].usable_gb == pytest.approx(6 - queue - 2)
    assert kv_room(SPEC, caps, HALVES, 8192) < 8192
    s = summary(SPEC, caps, HALVES, 8192, kept=kept, blocks=DISK, ram_cap_gb=None)
    r = s["ranks"][0]
    assert (r["disk_queue_gb"], r["restore_gb"]) == (0.25, 2.0)
    assert r["most_gb"] == pytest.approx(
        r["weights_gb"] + r["runtime_gb"] + r["kv_room_gb"] + r["prompt_cache_gb"] + 2.25, abs=2e-3
    )
    # KV_BITS=8: the blocks take 0.53 of the KV's bytes, so the staging takes less
    bits8 = Blocks(disk=True, kv_share=KVBits(8, 64).share(2))
    assert set_aside(SPEC, [BIG, SMALL], HALVES, 8192, None, bits8)[1][0] == pytest.approx(
        (5.5 - queue - 2 * 0.53125) / 2
    )


def test_kv_bits_blocks_hold_more_tokens_in_the_same_gb():
    plain = summary(SPEC, [BIG, SMALL], HALVES, 8192, kept=[1.0, 1.0], blocks=Blocks())
    bits = summary(
        SPEC, [BIG, SMALL], HALVES, 8192, kept=[1.0, 1.0], blocks=Blocks(kv_share=0.53125)
    )
    assert plain["prompt_cache"]["ram_tokens"] == 4096
    assert bits["prompt_cache"]["ram_tokens"] == int(4096 / 0.53125)
    assert packed_share(8, 64, 2) == KVBits(8, 64).share(2) and packed_share(0, 64, 2) == 1.0


def test_a_tensor_rank_keeps_its_share_of_every_layers_blocks():
    caps = [Capabilities("a", 16, 8, 10, 400), Capabilities("b", 16, 8, 10, 400)]
    plan = tensor_plan(4, 2)
    held, kept = set_aside(SPEC, caps, plan, 8192, None, Blocks(), even_sizes(2))
    s = summary(SPEC, held, plan, 8192, kept=kept, blocks=Blocks(), ram_cap_gb=None)
    # each holds half of every layer's KV: 4 x 64 KiB a token
    assert s["prompt_cache"]["token_bytes"] == 4 * 2**16
    assert [r["prompt_cache_tokens"] for r in s["ranks"]] == [int(k * GIB / 2**18) for k in kept]


def test_each_modes_kv_room_is_what_the_prompt_cache_leaves():
    """The modes' table predicts the KV room the summary gives, the prompt cache set aside."""
    plan, caps, kept, choice = plan_mode(
        SPEC,
        [BIG, SMALL],
        None,
        "pipeline",
        "custom",
        8192,
        layers=(2, 2),
        prompt_cache_gb=None,
        split=even_sizes(2),
        allsum=DEFAULT_ALLSUM["ring"],
        blocks=DISK,
    )
    assert kept[1] == 0.0
    room = kv_room(SPEC, caps, plan, 8192)
    assert choice.modes["pipeline"]["kv_capacity_tokens"] == room < 8192
    assert plan_for(SPEC, [BIG, SMALL], None, "custom", 8192, (2, 2), None, None, DISK)[2] == kept


def test_the_report_shows_each_rank_s_tiers():
    caps, kept = set_aside(SPEC, [BIG, SMALL], HALVES, 8192, None, DISK)
    s = summary(SPEC, caps, HALVES, 8192, kept=kept, blocks=DISK, ram_cap_gb=None)
    lines = format_summary(s).splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("prompt cache"))
    assert "RAM tier" in lines[head] and "restore staging" in lines[head]
    row = "rank 0 1.62 GB 6,656 tokens 0.25 GB 2.00 GB"  # (5.5 - 0.25 - 2) / 2 GiB
    assert lines[head + 1].split() == row.split()
    assert lines[head + 2].split()[2:6] == ["0.00", "GB", "0", "tokens"]
    assert lines[head + 3].startswith("RAM tier: 0 tokens for the ring, as many as rank 1 holds")
    assert "(PROMPT_CACHE_GB=auto)" in lines[head + 3] and "KV_TOKENS=8192" in lines[head + 3]
    capped = summary(SPEC, caps, HALVES, 8192, kept=[1.0, 1.0], blocks=Blocks(), ram_cap_gb=1.0)
    assert "at most PROMPT_CACHE_GB=1" in format_summary(capped)
    assert "write queue" not in format_summary(capped)
    # no prompt cache at all: no lines of it
    off = summary(SPEC, [BIG, SMALL], HALVES, 8192, kept=[0.0, 0.0], blocks=Blocks())
    assert "prompt cache" not in format_summary(off)


def test_the_disk_tier_line_says_its_cap_folder_and_tokens(tmp_path):
    folder = tmp_path / "blocks"
    (folder / "scope" / "ab").mkdir(parents=True)
    with open(folder / "scope" / "ab" / f"{'ab' * 16}.kv", "wb") as f:
        f.truncate(GIB // 2)  # a block file of 0.5 GiB, sparse
    ring = {"token_bytes": 2.0**18}
    fixed = disk_here(2.0, None, folder, tmp_path)
    assert fixed["held_gb"] == 0.5 and fixed["cap_gb"] == 2.0
    assert format_disk(fixed, ring) == (
        f"disk tier: 2 GB a rank (PROMPT_DISK_GB), 8,192 tokens; on this machine in {folder}, "
        "which holds 0.5 GB of blocks now"
    )
    auto = disk_here(None, 0.0, folder, tmp_path)
    assert 0 < auto["cap_gb"] <= 100
    assert format_disk(auto, ring).startswith(
        "disk tier: a quarter of each host's free space above its floor, at most 100 GB a rank "
        f"(PROMPT_DISK_GB=auto); on this machine {auto['cap_gb']:.1f} GB ("
    )
    assert format_disk(disk_here(0, None, folder, tmp_path), ring) == (
        "disk tier: off (PROMPT_DISK_GB=0)"
    )
    # nothing is made where the folder is not there yet
    assert disk_here(1.0, None, tmp_path / "new", tmp_path)["held_gb"] == 0.0
    assert not (tmp_path / "new").exists()


def test_prompt_cache_gb_is_auto_by_default_a_number_caps_it(monkeypatch):
    monkeypatch.delenv("PROMPT_CACHE_GB", raising=False)
    assert parse_config([])[0].prompt_cache_gb is None
    assert parse_config(["--prompt-cache-gb", "2.5"])[0].prompt_cache_gb == 2.5
    assert parse_config(["--prompt-cache-gb", "0"])[0].prompt_cache_gb == 0.0
    monkeypatch.setenv("PROMPT_CACHE_GB", "auto")
    assert parse_config([])[0].prompt_cache_gb is None
    for bad in ("-1", "lots"):
        with pytest.raises(ValueError, match=f"PROMPT_CACHE_GB='{bad}' must be auto or GB >= 0"):
            parse_config(["--prompt-cache-gb", bad])


def test_the_dry_run_shows_the_tiers(tmp_path, capsys):
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_CONFIG | {"torch_dtype": "bfloat16"}))
    hosts = tmp_path / "hosts.json"
    mac = {"tflops": 17, "bandwidth_gbs": 480}
    hosts.write_text(
        json.dumps(
            [
                {"ssh": "studio", "ips": ["10.0.0.1"], "memory_gb": 128, **mac},
                {"ssh": "mini", "ips": ["10.0.0.2"], "memory_gb": 32, **mac},
            ]
        )
    )
    args = ["--hostfile", str(hosts), "--model", str(model), "--layers", "", "--kv-tokens", "8192"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--prompt-cache-gb", "auto"]
    assert main([*args, "--prompt-disk-gb", "10", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    ranks = d["ranks"]
    # Llama-3-8B's blocks: 128 KiB a token over its 32 layers, in bfloat16
    assert d["prompt_cache"]["token_bytes"] == max(
        r["layers"][1] - r["layers"][0] for r in ranks
    ) * (4096)
    assert d["prompt_cache"]["ram_tokens"] == min(r["prompt_cache_tokens"] for r in ranks) > 8192
    assert all(r["disk_queue_gb"] == 0.25 and r["restore_gb"] > 0 for r in ranks)
    assert d["disk_tier"]["cap_gb"] == 10
    assert d["disk_tier"]["folder"] == str(disk_folder(None, tmp_path / "cache"))
    assert main([*args, "--prompt-disk-gb", "10"]) == 0
    text = capsys.readouterr().out
    tokens = int(10 * GIB / d["prompt_cache"]["token_bytes"])
    assert f"disk tier: 10 GB a rank (PROMPT_DISK_GB), {tokens:,} tokens" in text
    assert f"RAM tier: {d['prompt_cache']['ram_tokens']:,} tokens for the ring" in text


def test_held_bytes_skips_an_old_scope_another_start_deletes_meanwhile(tmp_path, monkeypatch):
    """Two servers on one machine share the disk tier's root: one start may delete an old
    scope's folder while the other counts what the root holds."""
    import os

    from mlx_ring.cache_sizes import held_bytes

    for scope, size in (("aa", 3), ("bb.deleting-1-2", 5)):
        (tmp_path / scope / "0f").mkdir(parents=True)
        (tmp_path / scope / "0f" / "0f00.kv").write_bytes(b"x" * size)
    real = os.scandir

    def vanishing(path="."):
        if ".deleting" in str(path):  # deleted between the root's listing and its own
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", vanishing)
    assert held_bytes(tmp_path) == 3
    assert held_bytes(tmp_path / "none") == 0
