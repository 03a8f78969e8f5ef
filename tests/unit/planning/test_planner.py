"""`./launch.sh plan`, the planner's dry run: sizes from config.json alone, capabilities
from hosts.json or from a probe of this host, text and --json, and each mode's tokens/s and
the choice between them."""

import json

from modeshapes import LLAMA_CONFIG


def test_dry_run_from_config_json_and_hostfile_keys(tmp_path, capsys):
    """`./launch.sh plan`: sizes from config.json alone, capabilities from
    hosts.json, text and --json."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {
                    "ssh": "studio",
                    "ips": ["10.0.0.1"],
                    "memory_gb": 48,
                    "tflops": 17,
                    "bandwidth_gbs": 480,
                },
                {
                    "ssh": "mini",
                    "ips": ["10.0.0.2"],
                    "memory_gb": 16,
                    "tflops": 3.5,
                    "bandwidth_gbs": 100,
                },
            ]
        )
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--strategy",
        "balanced",
        "--layers",
        "",
        "--kv-tokens",
        "8192",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (
        "32 layers x 0.41 GB" in text
        and "plan balanced" in text
        and "tokens/s for one stream" in text
    )
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["layers"] for r in d["ranks"]] == [[0, 26], [26, 32]] and d["other_strategies"][
        "uniform"
    ]["sizes"] == [16, 16]
    assert main([*args, "--kv-tokens", "400000"]) == 2  # 50 GB of KV cache: nothing fits
    assert "the model does not fit" in capsys.readouterr().err


def test_dry_run_keeps_a_probed_macs_working_set(tmp_path, capsys, monkeypatch):
    """A host probed here is planned as the ring would plan it: its GPU wires no
    more than Metal allows."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-8b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {"ssh": "mac", "ips": ["10.0.0.1"], "max_memory_gb": 50},
                {
                    "ssh": "mini",
                    "ips": ["10.0.0.2"],
                    "memory_gb": 16,
                    "tflops": 3.5,
                    "bandwidth_gbs": 100,
                },
            ]
        )
    )
    monkeypatch.setenv(
        "MLX_RING_CAPS",
        json.dumps(
            [
                {
                    "memory_gb": 64,
                    "usable_gb": 40,
                    "working_set_gb": 30,
                    "tflops": 10,
                    "bandwidth_gbs": 400,
                }
            ]
        ),
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--layers",
        "",
        "--prompt-cache-gb",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
    ]
    assert main(args) == 0
    mac = json.loads(capsys.readouterr().out)["ranks"][0]
    assert mac["host"] == "mac" and mac["working_set_gb"] == 30 and mac["usable_gb"] == 30


def test_the_dry_run_prints_each_mode_and_the_choice(tmp_path, capsys):
    """`./launch.sh plan` on two Macs cabled for RDMA: tensor mode, each mode's tokens/s and why."""
    from mlx_ring.planning.planner import main

    model = tmp_path / "llama-70b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                **LLAMA_CONFIG,
                "hidden_size": 8192,
                "intermediate_size": 28672,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "torch_dtype": "bfloat16",
            }
        )
    )
    ultra = {"memory_gb": 192, "tflops": 28, "bandwidth_gbs": 800}
    hosts = tmp_path / "hosts.json"
    hosts.write_text(
        json.dumps(
            [
                {"ssh": "ultra-1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en5"], **ultra},
                {"ssh": "ultra-2", "ips": ["10.0.0.2"], "rdma": ["rdma_en5", None], **ultra},
            ]
        )
    )
    args = [
        "--hostfile",
        str(hosts),
        "--model",
        str(model),
        "--layers",
        "",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--parallel",
        "auto",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out.splitlines()
    assert f"plan tensor for {hosts}:" in text
    table = text.index(next(x for x in text if x.startswith("mode ") and "1 stream" in x))
    assert text[table + 1].startswith("pipeline ") and text[table + 2].startswith("tensor ")
    assert "over JACCL (Thunderbolt)" in text[table + 2]
    assert (
        text[table + 4].startswith("mode tensor: 2 ranks, all_sum 0.0")
        and "x the pipeline's one stream" in text[table + 4]
    )
    assert any(
        x.startswith("other pipelines: balanced 39/41") and "uniform 40/40" in x for x in text
    )
    assert any("the all_sum was not measured on this ring" in x for x in text)
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "tensor" and d["mode_reason"] == text[table + 4][len("mode ") :]
    assert [r["layers"] for r in d["ranks"]] == [[0, 80], [0, 80]] and [
        r["share"] for r in d["ranks"]
    ] == [0.5, 0.5]
    assert d["modes"]["tensor"]["tokens_per_s"]["1"] == d["predicted_tokens_per_s"]
    assert main([*args, "--parallel", "pipeline", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (
        d["mode"] == "pipeline"
        and d["mode_reason"] == "pipeline: PARALLEL=pipeline"
        and d["ranks"][0]["layers"] == [0, 39]
    )
