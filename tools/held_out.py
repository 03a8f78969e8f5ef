"""A check the model matrix never saw: variants of supported types (other widths, layer counts, expert
counts, layer patterns, seeds) served split on 2 ranks under mlx.launch, against single-process mlx-lm,
with other prompts than the matrix's. A model that passes here was not tuned to pass.

    python -m tools.held_out [--keep DIR]

Prints one line a variant: `exact`, or how it differs (logits within 1e-4 and equal tokens, as the
matrix judges).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from model_zoo import make
from ringutil import launch_cmd

from tests.ring.test_model_matrix import judge

DRIVER = str(ROOT / "tests" / "matrix_driver.py")
# Four sequences, one longer than every tiny window, two joining a running batch.
SPEC = [{"prompt": [11, 200, 37, 5, 5, 64, 90, 3, 18, 144, 2, 71], "max_tokens": 5, "at": 0},
        {"prompt": [250, 6, 19], "max_tokens": 6, "at": 0},
        {"prompt": [42], "max_tokens": 4, "at": 1},
        {"prompt": [9, 8, 7, 6, 5, 4], "max_tokens": 3, "at": 3}]
GROUPS, CHUNK = 1, 8

MOE_8X3 = {"num_hidden_layers": 5, "num_experts": 8, "num_experts_per_tok": 3}
# (name, type, config changes, seed, layers per rank, bits)
VARIANTS = [
    ("llama-5x96", "llama", {"num_hidden_layers": 5, "hidden_size": 96, "num_attention_heads": 6,
                             "num_key_value_heads": 3}, 1, "2,3", 0),
    ("qwen3_moe-8x3", "qwen3_moe", MOE_8X3, 2, "3,2", 0),
    ("qwen3_moe-8x3-4bit", "qwen3_moe", MOE_8X3, 2, "3,2", 4),
    ("mixtral-6x1", "mixtral", {"num_hidden_layers": 3, "num_local_experts": 6, "num_experts_per_tok": 1}, 3, "1,2", 0),
    ("deepseek_v3-8x3", "deepseek_v3", {"num_hidden_layers": 5, "n_routed_experts": 8, "num_experts_per_tok": 3,
                                        "first_k_dense_replace": 2}, 4, "2,3", 0),
    ("gemma3_text-6", "gemma3_text", {"num_hidden_layers": 6, "sliding_window_pattern": 3, "sliding_window": 5}, 5,
     "4,2", 0),
    ("qwen3_next-6", "qwen3_next", {"num_hidden_layers": 6, "full_attention_interval": 3}, 6, "2,4", 0),
    ("mamba2-5", "mamba2", {"num_hidden_layers": 5}, 7, "3,2", 0),
    ("gpt2-5x96", "gpt2", {"n_layer": 5, "n_embd": 96, "n_head": 6}, 8, "3,2", 0),
    ("talkie-5", "talkie", {"num_hidden_layers": 5}, 9, "2,3", 0),
    ("rwkv7-5x96", "rwkv7", {"num_hidden_layers": 5, "hidden_size": 96}, 10, "4,1", 0),
    ("bailing_moe_linear-6", "bailing_moe_linear", {"num_hidden_layers": 6, "layer_group_size": 3}, 11, "4,2", 0),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep", type=Path, help="write the models and results here (else a temporary folder)")
    a = p.parse_args()
    tmp = a.keep or Path(tempfile.mkdtemp(prefix="held-out-"))
    models, alone, ring = [], [], []
    for name, kind, changes, seed, _, bits in VARIANTS:
        models.append(make(kind, tmp / "models" / name, bits=bits, changes=changes, seed=seed))
        for d in (alone, ring):
            d.append(tmp / ("alone" if d is alone else "ring") / name)
            d[-1].mkdir(parents=True, exist_ok=True)
    common = ["--spec", json.dumps(SPEC), "--groups", str(GROUPS), "--chunk", str(CHUNK), "--model", *map(str, models)]
    # mlx-lm alone, in one process: the reference logits (and the whole model through the scheduler).
    subprocess.run([sys.executable, DRIVER, "--keep-going", *common, "--out", *map(str, alone),
                    "--layers", *["-"] * len(models)], cwd=ROOT, check=False, capture_output=True)
    argv = [DRIVER, *common, "--out", *map(str, ring), "--layers", *(v[4] for v in VARIANTS), "--stall", "60"]
    proc = subprocess.run(launch_cmd(2, tmp, argv), cwd=ROOT, capture_output=True, text=True, timeout=900)
    for (name, kind, changes, seed, sizes, bits), a_out, r_out in zip(VARIANTS, alone, ring):
        if not (a_out / "want.json").exists():
            verdict = f"no reference: {_error(a_out)}"
        elif not all((r_out / f"done{r}").exists() for r in range(2)):
            verdict = f"ring run did not finish: {_error(r_out) or proc.stderr[-300:]!r}"
        else:
            verdict = judge(r_out, a_out, 2) or "exact"
        print(f"{name:24} {kind:20} split {sizes:5} seed {seed:2}  {verdict}")


def _error(out: Path) -> str:
    errors = sorted(out.glob("error*.txt"))
    return errors[0].read_text().strip().splitlines()[0][:200] if errors else ""


if __name__ == "__main__":
    main()
