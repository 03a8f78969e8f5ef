"""KV_BITS: a block kept quantized (in RAM, and through the disk tier's bytes) loads back close to
the KV it was cut from, in its dtype and shape; the bits change the keys' salt and so the disk
scope; the RAM budget counts the smaller blocks; a model whose heads fit no group, and any other
number of bits, are refused at start."""

import re
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import QuantizedKVCache

from mlx_ring.cache import tiers
from mlx_ring.cache.blocks import key_ints
from mlx_ring.cache.held import HeldBlocks, from_record, to_record
from mlx_ring.cache.kvbits import OFF, KVBits, for_model, group_size
from mlx_ring.config import parse_config
from mlx_ring.planning.cluster import Cluster, RankFacts
from mlx_ring.planning.plan import ModelSpec, uniform_plan
from mlx_ring.serving import startup

KEY = bytes(range(16))


def prompt_kv(dtype, layers=2, tokens=40, columns=64, seed=0):
    """A row's per-layer (keys, values): (1, 2 heads, tokens, columns)."""
    mx.random.seed(seed)
    return [
        tuple(mx.random.normal((1, 2, tokens, columns)).astype(dtype) for _ in range(2))
        for _ in range(layers)
    ]


def kept_and_loaded(kv: KVBits, cache, n: int, via_disk: bool = False):
    """`cache`'s first `n` positions kept as one block by a rank keeping them as `kv` says, then
    loaded back (through the disk tier's bytes where `via_disk`)."""
    held = HeldBlocks(0)
    held.kv = kv

    def span(row, tokens, start, end):
        return [tuple(a[..., start:end, :] for a in layer) for layer in cache]

    held.keep([[0, n, 0, 1, *key_ints(KEY)]], 64, span)
    if via_disk:
        held.ram[KEY] = from_record(to_record(held.ram[KEY]))
    return held, held.load([[key_ints(KEY)]], n)[0]


# a dtype's rounding: half its last place, relative
EPS = {mx.float32: 2**-24, mx.float16: 2**-11, mx.bfloat16: 2**-8}


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("via_disk", [False, True])
def test_a_block_kept_quantized_loads_back_close_in_its_dtype_and_shape(dtype, bits, via_disk):
    cache = prompt_kv(dtype)
    n = 37  # the block's first 37 positions of 40: a tail, cut at LOAD
    held, loaded = kept_and_loaded(KVBits(bits, 64), cache, n, via_disk)
    for layer, want in zip(loaded, cache, strict=True):
        # what mlx-lm's own quantized cache holds of the same KV, dequantized
        mlx_lm = QuantizedKVCache(group_size=64, bits=bits)
        theirs = mlx_lm.update_and_fetch(*(a[..., :n, :] for a in want))
        assert len(layer) == 2
        for got, a, q in zip(layer, want, theirs, strict=True):
            assert got.dtype == dtype and got.shape == (1, 2, n, 64)
            assert mx.array_equal(got, mx.dequantize(*q, group_size=64, bits=bits)).item()
            # MLX keeps a group's zero exact, so a value may be a whole step of its group off
            # (the group's span over 2**bits - 1), and the dtype rounds scale and result
            x = np.array(a[..., :n, :].astype(mx.float32))
            step = (x.max(-1, keepdims=True) - x.min(-1, keepdims=True)) / (2**bits - 1)
            bound = step + 4 * EPS[dtype] * np.abs(x).max(-1, keepdims=True)
            assert (np.abs(np.array(got.astype(mx.float32)) - x) <= bound).all(), bits
    plain = kept_and_loaded(OFF, cache, n)[0]
    assert held.ram_bytes() < plain.ram_bytes()


def test_unquantized_blocks_load_back_exact():
    cache = prompt_kv(mx.float16)
    _, loaded = kept_and_loaded(OFF, cache, 40)
    for layer, want in zip(loaded, cache):
        for got, a in zip(layer, want):
            assert mx.array_equal(got, a).item()


@pytest.mark.parametrize("dtype, bits", [(mx.float16, 8), (mx.float16, 4), (mx.float32, 8)])
def test_a_quantized_block_takes_the_share_of_the_bytes_it_is_budgeted_at(dtype, bits):
    cache = prompt_kv(dtype)
    quantized, _ = kept_and_loaded(KVBits(bits, 64), cache, 40)
    plain, _ = kept_and_loaded(OFF, cache, 40)
    share = quantized.ram_bytes() / plain.ram_bytes()
    assert share == pytest.approx(KVBits(bits, 64).share(dtype.size))
    # 8 bits of a 16-bit cache: about half the bytes, a scale and a bias per 64 values on top
    assert share == pytest.approx(
        {(2, 8): 0.53125, (2, 4): 0.28125, (4, 8): 0.28125}[dtype.size, bits]
    )


def test_the_group_is_64_where_it_divides_a_head_else_32_else_refused():
    assert group_size((128,)) == 64 and group_size((512, 64)) == 64
    assert group_size((96,)) == 32 and group_size((32,)) == 32
    with pytest.raises(ValueError, match=re.escape("KV_BITS quantizes a head's KV columns (80")):
        group_size((80,))
    head = SimpleNamespace(head_dim=96, kv_lora_rank=0, rope_head_dim=0)
    assert for_model(8, head) == KVBits(8, 32) and for_model(0, head) == OFF
    with pytest.raises(ValueError, match="set KV_BITS=0 for this model"):
        for_model(4, SimpleNamespace(head_dim=16, kv_lora_rank=0, rope_head_dim=0))
    latent = SimpleNamespace(head_dim=192, kv_lora_rank=512, rope_head_dim=64)
    assert for_model(4, latent) == KVBits(4, 64)


def test_the_bits_change_the_salt_and_so_the_disk_scope():
    salts = {tiers.salt("m", 256, kv) for kv in (OFF, KVBits(8, 64), KVBits(4, 64), KVBits(8, 32))}
    assert len(salts) == 4
    # unquantized keys are those kept before KV_BITS existed: their blocks on disk still match
    assert tiers.salt("m", 256) == tiers.salt("m", 256, OFF)
    scopes = {tiers.scope(s, (0, 4), (0, 1), "float16") for s in salts}
    assert len(scopes) == 4


def test_the_ram_budget_counts_the_smaller_blocks():
    plan = uniform_plan(8, 2)
    spec = ModelSpec(8, 1e6, 1e6, 1e6, 4096.0, 1e6, 1e6, dtype="float16")
    cfg = SimpleNamespace(prompt_cache_gb=1.0, prompt_cache_block=256)
    cluster = Cluster((RankFacts(0, "a", (0, 4)), RankFacts(1, "b", (4, 8))))

    def budget(kv):
        held = HeldBlocks(0)
        held.kv = kv
        shard = SimpleNamespace(held=held, plain_kv=True, cacheable=True, plan=plan)
        return startup.prompt_cache(cfg, shard, spec, cluster).budget

    plain = budget(OFF)
    assert plain == 2**30 // (4096 * 4)
    assert budget(KVBits(8, 64)) == int(2**30 / (4096 * 4 * 0.53125))  # about twice
    assert budget(KVBits(4, 64)) == int(2**30 / (4096 * 4 * 0.28125))  # about 3.6 times


@pytest.mark.parametrize("argv", [["--kv-bits", "5"], ["--kv-bits", "16"], ["--kv-bits", "-8"]])
def test_other_bits_are_refused_naming_the_setting_and_its_choices(monkeypatch, argv):
    monkeypatch.delenv("KV_BITS", raising=False)
    with pytest.raises(ValueError, match=r"KV_BITS=-?\d+ must be one of 0 \(off\), 8 or 4"):
        parse_config(argv)
    monkeypatch.setenv("KV_BITS", "eight")
    with pytest.raises(ValueError, match="KV_BITS='eight' must be a number"):
        parse_config([])


def test_kv_bits_is_off_by_default_and_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("KV_BITS", raising=False)
    assert parse_config([])[0].kv_bits == 0
    monkeypatch.setenv("KV_BITS", "8")
    assert parse_config([])[0].kv_bits == 8
    assert parse_config(["--kv-bits", "4"])[0].kv_bits == 4
