"""A draft model made offline from a model's own weights: its first K layers, then its own final
norm and head. Same tokenizer, a fraction of the cost, and guesses that agree with the full model
often enough to time speculative decoding with a draft model (DRAFT_MODEL, mlx_lm.server's
--draft-model) where no smaller sibling model can be downloaded.

    .venv/bin/python tools/early_exit_model.py MODEL_DIR OUT_DIR --layers 10
"""

import argparse
import json
import re
import shutil
from pathlib import Path

import mlx.core as mx

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def early_exit(src: Path, out: Path, layers: int) -> None:
    config = json.loads((src / "config.json").read_text())
    total = config["num_hidden_layers"]
    if not 0 < layers < total:
        raise ValueError(
            f"--layers {layers}: the model has {total} layers; keep between 1 and {total - 1}"
        )
    out.mkdir(parents=True, exist_ok=True)
    kept = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, w in mx.load(str(f)).items():
            m = LAYER.search(name)
            if m is None or int(m.group(1)) < layers:
                kept[name] = w
    mx.save_safetensors(str(out / "model.safetensors"), kept, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}, indent=2))
    for f in src.iterdir():
        if (
            f.is_file()
            and f.suffix != ".safetensors"
            and f.name not in ("config.json", "model.safetensors.index.json")
        ):
            shutil.copy(f, out / f.name)


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "model", type=Path, help="an MLX model folder (one whose layers are `...layers.N...`)"
    )
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, required=True, help="how many of the first layers to keep")
    a = p.parse_args()
    early_exit(a.model, a.out, a.layers)
    print(a.out)


if __name__ == "__main__":
    main()
