"""The planner on a real ring: capabilities overridden per rank (MLX_RING_CAPS) and per host
(hosts.json's max_memory_gb) give the expected uneven split on every rank, and the ring still
computes exactly what single-process mlx-lm computes."""

import json

import numpy as np
from ringutil import ROOT, launch, make_tiny_model, reference_logits

from mlx_ring.planning.assemble import serving
from mlx_ring.planning.capabilities import Capabilities, with_host_keys
from mlx_ring.planning.cost import per_layer_bytes, runtime_bytes
from mlx_ring.planning.plan import GIB
from mlx_ring.planning.sizes import spec_from_folder
from mlx_ring.planning.strategies import plan_layers

DRIVER = str(ROOT / "tests" / "planner_driver.py")
KV_TOKENS = 1_000_000  # makes each tiny layer's KV reserve ~0.24 GB, so memory budgets bite
# A fast "studio" and two slower "minis" (distinct hosts, so the planner treats them as machines).
CAPS = [
    {"host": "studio", "device": "CPU", "memory_gb": 16, "tflops": 1.0, "bandwidth_gbs": 100.0},
    {"host": "mini-1", "device": "CPU", "memory_gb": 16, "tflops": 1.0, "bandwidth_gbs": 20.0},
    {"host": "mini-2", "device": "CPU", "memory_gb": 16, "tflops": 1.0, "bandwidth_gbs": 40.0},
]


def test_balanced_uneven_split_runs_token_exact(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")  # 7 layers
    # as the ranks plan: PREFILL_CHUNK auto, MAX_ACTIVE 16
    spec = serving(spec_from_folder(model), 0, 16)
    caps = [
        Capabilities(c["host"], 16, 16 * 2 / 3, c["tflops"], c["bandwidth_gbs"], "CPU")
        for c in CAPS
    ]
    # Room on the studio for its embedding and head and 3.5 layers: it may take 3 (it would take 4).
    room = (
        runtime_bytes(spec, caps[0], 0, 3, KV_TOKENS)
        + spec.ends_bytes
        + 3.5 * per_layer_bytes(spec, KV_TOKENS)
    ) / GIB
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps(
            [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "max_memory_gb": room}]
            + [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2
        )
    )
    # what the memory cap changes
    assert plan_layers(spec, caps, "balanced", KV_TOKENS).sizes == [4, 1, 2]
    assert plan_layers(
        spec, [with_host_keys(caps[0], {"max_memory_gb": room}), *caps[1:]], "balanced", KV_TOKENS
    ).sizes == [3, 1, 3]

    prompt = [5, 17, 42, 99, 3, 250, 7]
    spec_arg = json.dumps([{"prompt": prompt, "max_tokens": 6, "at": 0}])
    argv = [
        DRIVER,
        "--model",
        str(model),
        "--out",
        str(tmp_path),
        "--",
        "--model",
        str(model),
        "--spec",
        spec_arg,
        "--out",
        str(tmp_path),
    ]
    env = {
        "MLX_RING_CAPS": json.dumps(CAPS),
        "HOSTFILE": str(hostfile),
        "KV_TOKENS": str(KV_TOKENS),
        "STRATEGY": "balanced",
        "LAYERS": "",
        "PROMPT_CACHE_GB": "0",
        "PROMPT_DISK_GB": "0",  # no prompt cache: its disk tier's buffers would take room too
    }
    launch(3, tmp_path, argv, timeout=120, env=env)

    plans = [json.loads((tmp_path / f"plan{r}.json").read_text()) for r in range(3)]
    assert all(p == plans[0] for p in plans), "every rank must compute the same plan"
    assert plans[0]["ranges"] == [[0, 3], [3, 4], [4, 7]] and plans[0]["strategy"] == "balanced"
    ranks = plans[0]["predicted"]["ranks"]
    assert [r["host"] for r in ranks] == ["studio", "mini-1", "mini-2"]
    assert ranks[0]["usable_gb"] == round(room, 2) and ranks[0]["needs_gb"] <= room
    # what the ring admits: the reserve at least
    assert plans[0]["predicted"]["kv_capacity_tokens"] >= KV_TOKENS
    assert [json.loads((tmp_path / f"rank{r}.json").read_text())["layers"] for r in range(3)] == [
        [0, 3],
        [3, 4],
        [4, 7],
    ]

    logits = np.load(tmp_path / "logits0.npy")
    tokens = json.loads((tmp_path / "result.json").read_text())["tokens"][0]
    want, want_tokens = reference_logits(model, prompt, steps=6)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    assert tokens == want_tokens
