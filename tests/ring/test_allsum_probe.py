"""The all_sum over a real ring: the probe `./launch.sh check` runs under mlx.launch prints what it
measured, and a ring started with PARALLEL=auto measures it once, caches it, and every rank chooses
the same mode for the same reason; and an array summed in pieces there is the array summed whole."""

import json

from ringutil import ROOT, launch, make_tiny_model, write_hostfile

from mlx_ring.planning.allsum import PROBE, ROUNDS, cached, fit, implausible, parse, ring_key

DRIVER = str(ROOT / "tests" / "planner_driver.py")


def test_the_probe_measures_the_rings_all_sum(tmp_path):
    out = launch(
        2, tmp_path, ["-m", "mlx_ring.planning.probe", "allsum", "576", "float32"], timeout=120
    ).stdout
    found = parse(out)
    assert found is not None, out
    assert found["ranks"] == 2 and found["hidden"] == 576 and found["bytes_per_element"] == 4
    # no CUDA here: the all_sums a tensor ring would run, over the ring backend
    assert found["backend"] == "ring"
    assert 0 < found["rows_1_ms"] and 0 < found["rows_64_ms"]
    # Rounds past the warm-up, the lower quartile kept: never above their median.
    assert (
        found["probe"] == PROBE
        and 1 <= found["rounds"] <= ROUNDS
        and "older probe" not in implausible(found)
    )
    assert (
        found["rows_1_ms"] <= found["rows_1_median_ms"]
        and found["rows_64_ms"] <= found["rows_64_median_ms"]
    )
    a = fit(found)
    assert a.latency_ms >= 0 and a.gbytes_s > 0 and a.source.startswith("measured on this ring")


PIECES = """
import mlx.core as mx
from mlx_ring.tensor.sums import sum_in_pieces
from mlx_ring.ring.world import init_world
world = init_world()
x = mx.random.normal((2, 700, 576), key=mx.random.key(world.rank()))  # 3.2 MB: pieces; each rank's own
whole, pieces = mx.distributed.all_sum(x, group=world), sum_in_pieces(x, group=world)
print("rank", world.rank(), "equal", mx.array_equal(whole, pieces).item(), "summed", not mx.allclose(whole, x).item())
"""


def test_an_array_summed_in_pieces_is_the_array_summed_whole(tmp_path):
    out = launch(2, tmp_path, ["-c", PIECES], timeout=120).stdout
    assert out.count("equal True summed True") == 2, out


def test_auto_measures_the_all_sum_once_and_every_rank_chooses_alike(tmp_path):
    model = make_tiny_model(tmp_path / "model", "llama")  # 4 heads, 2 KV heads: it splits 2 ways
    spec = json.dumps([{"prompt": [5, 17, 42], "max_tokens": 2, "at": 0}])
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
        spec,
        "--out",
        str(tmp_path),
    ]
    env = {
        "PARALLEL": "auto",
        "HOSTFILE": str(ROOT / "hosts.json"),
        "LAYERS": "",
        "PROMPT_CACHE_GB": "0",
        "MLX_RING_CAPS": json.dumps(
            [{"host": h, "memory_gb": 16, "tflops": 0.05, "bandwidth_gbs": 5} for h in "ab"]
        ),
    }
    launch(2, tmp_path, argv, timeout=180, env=env)
    plans = [json.loads((tmp_path / f"plan{r}.json").read_text())["predicted"] for r in range(2)]
    assert plans[0] == plans[1], "every rank must choose the same mode for the same reason"
    p = plans[0]
    # Two "machines" (MLX_RING_CAPS) with tiny layers: the all_sums cost more
    # than sharing them saves.
    assert p["mode"] == "pipeline" and p["mode_reason"].startswith("pipeline: all_sum ")
    assert p["modes"]["tensor"]["allsum_from"].startswith("measured on this ring")
    hosts = [e["ssh"] for e in json.loads((ROOT / "hosts.json").read_text())]
    row = json.loads((tmp_path / "cache" / "allsum.json").read_text())[ring_key(hosts)]
    assert row["ranks"] == 2 and row["probe"] == PROBE
    # The next start reads it instead of measuring, unless this loaded machine timed stalls
    # (then it measures again).
    kept = cached(tmp_path / "cache", ring_key(hosts))
    assert (
        kept is not None and kept.source.startswith("measured") and kept.ranks == 2
    ) or implausible(row)


def test_checks_probe_runs_the_launcher_on_every_host_and_caches_it(tmp_path):
    """`./launch.sh check`'s path: mlx.launch over the ring's hostfile, `./launch.sh probe
    allsum` on each host, the result cached under the ring's hosts for the planner."""
    from mlx_ring.hostfile import load_hosts
    from mlx_ring.hosts import ssh
    from mlx_ring.launcher.collectives import measure_ring
    from mlx_ring.ring.launch import free_port

    hostfile = write_hostfile(tmp_path / "hosts.json", 2)
    hosts = load_hosts(hostfile, free_port(3))
    conf = ssh.write_config(tmp_path / "ssh_config")
    said, allsum = measure_ring(hosts, conf, hosts[0].port, 576, "float32", tmp_path / "cache")
    assert allsum is not None, said
    assert said.startswith("all_sum over the ring (2 ranks): ") and "for (64, 576) float32" in said
    key = ring_key(["127.0.0.1", "127.0.0.1"])
    row = json.loads((tmp_path / "cache" / "allsum.json").read_text())[key]
    assert row["ranks"] == 2 and row["probe"] == PROBE
    # Read back as measured, unless this loaded machine timed stalls (then the
    # next start measures again).
    kept = cached(tmp_path / "cache", key)
    assert (kept is not None and kept.latency_ms == allsum.latency_ms) or implausible(row)
    assert measure_ring(hosts[:1], conf, hosts[0].port, 576, "float32", tmp_path / "cache") == (
        "",
        None,
    )
