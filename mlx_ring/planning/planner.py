"""Planning at the edges: hosts.json's per-host keys, the startup exchange that gives every rank the
same inputs, and the dry run `./launch.sh plan` (prints a plan without loading a weight).

The arithmetic lives in plan.py, cost.py and strategies.py (pure); measuring lives in probe.py.
"""

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from mlx_ring.cache_sizes import GROUPS, disk_here, group_size, head_columns, packed_share
from mlx_ring.config import Config, parse_config
from mlx_ring.hostfile import host_keys, load_entries
from mlx_ring.models.shape import read_shape
from mlx_ring.planning.allsum import backend_of, ring_allsum, ring_key
from mlx_ring.planning.assemble import plan_for, serving
from mlx_ring.planning.auto import plan_mode, shares_or_refusal, with_choice
from mlx_ring.planning.capabilities import Capabilities, compute_units, declared
from mlx_ring.planning.cost import layer_kv_bytes
from mlx_ring.planning.modes import AllSum
from mlx_ring.planning.plan import GIB, LayerPlan, ModelSpec
from mlx_ring.planning.promptcache import Blocks, format_disk
from mlx_ring.planning.report import format_summary, summary
from mlx_ring.planning.sizes import DTYPE_BYTES, spec_from_folder
from mlx_ring.planning.split import ShareSize
from mlx_ring.planning.strategies import STRATEGIES

log = logging.getLogger("planner")


def dtype_of(spec: ModelSpec) -> str:
    """The dtype the probe measures matmuls in: the model's activations (quantized: its scales')."""
    return (
        spec.dtype.split()[0]
        if spec.dtype.split()[0] in ("float32", "float16", "bfloat16")
        else "float16"
    )


def blocks_for(cfg: Config, spec: ModelSpec, config: dict | None) -> Blocks:
    """How the ranks keep the prompt cache's blocks: on a disk tier too unless PROMPT_DISK_GB=0,
    at KV_BITS in the group the model's heads take (64 where its config is unknown or fits none:
    the ranks refuse such a model at start), in blocks of PROMPT_CACHE_BLOCK."""
    share = 1.0
    if cfg.kv_bits:
        try:
            group = group_size(head_columns(read_shape(config))) if config else GROUPS[0]
        except (ValueError, KeyError, TypeError):
            group = GROUPS[0]
        share = packed_share(cfg.kv_bits, group, DTYPE_BYTES.get(dtype_of(spec), 2))
    return Blocks(disk=cfg.prompt_disk_gb != 0, kv_share=share, block=cfg.prompt_cache_block)


def plan_ring(
    cfg: Config,
    spec: ModelSpec,
    world,
    config: dict | None = None,
    sums: Callable[[], object] | None = None,
) -> tuple[LayerPlan, list[Capabilities], dict]:
    """Every rank measures itself; rank 0 adds the settings, hosts.json's keys, the model's
    sizes, how its layers split between the ranks (`config`: its config.json) and the ring's
    all_sum as cached; one exchange later every rank holds the same inputs and so computes the
    same plan (rank 0's win). PARALLEL=auto on a ring whose all_sum was never measured measures
    it first, every rank at once, over `sums()`: the group tensor mode's all_sums would run over
    (NCCL's on CUDA GPUs; default `world`). A plan the launcher provisioned (RING_PLAN) is kept
    as it is: each host holds only its slice."""
    from mlx_ring.planning.allsum import fit, measure, remember
    from mlx_ring.planning.probe import local_capabilities
    from mlx_ring.ring.world import exchange
    from mlx_ring.tensor.sums import nccl_sums

    rank, size = world.rank(), world.size()
    mine = {"caps": asdict(local_capabilities(cfg.cache_dir, dtype_of(spec), rank))}
    key, backend = "", "ring"
    if rank == 0:
        hosts, entries = [], []
        if cfg.hostfile.is_file():
            entries = load_entries(cfg.hostfile)
            if len(entries) == size:
                hosts = [host_keys(e) for e in entries]
            else:
                log.info(
                    "%s names %d hosts, the ring has %d: its per-host keys are not used",
                    cfg.hostfile,
                    len(entries),
                    size,
                )
                entries = []
        entries = entries or [{"ssh": "?"}] * size
        backend = "nccl" if nccl_sums(size) else backend_of(entries)
        key = ring_key([str(e.get("ssh", "")) for e in entries], backend)
        mine |= {
            "strategy": cfg.strategy,
            "layers": list(cfg.layers) if cfg.layers else None,
            "kv_tokens": cfg.kv_tokens,
            "prompt_cache_gb": cfg.prompt_cache_gb,
            "blocks": asdict(blocks_for(cfg, spec, config)),
            "hosts": hosts,
            "spec": asdict(serving(spec, cfg.prefill_chunk, cfg.max_active)),
            "provisioned": [cfg.plan[0], list(cfg.plan[1])] if cfg.plan else None,
            "parallel": cfg.parallel,
            "split": _plain(shares_or_refusal(config, size)),
            "allsum": asdict(ring_allsum(cfg.cache_dir, entries, backend)),
        }
    rows = exchange(mine, world)
    lead = rows[0]
    lead["split"] = (
        lead["split"] if isinstance(lead["split"], str) else [ShareSize(**p) for p in lead["split"]]
    )
    spec = ModelSpec(**lead["spec"])
    allsum = AllSum(**lead["allsum"])
    blocks = Blocks(**lead["blocks"])
    # Nothing to measure where tensor mode is out whatever its links cost: a model that does
    # not split, or ranks that take turns on one device (each would do the whole model's work,
    # and the all_sums too).
    splits = (
        isinstance(lead["split"], list)
        and compute_units([Capabilities(**r["caps"]) for r in rows]) > 1
    )
    if (
        splits
        and not allsum.source.startswith("measured")
        and lead["parallel"] == "auto"
        and size > 1
        and not lead["provisioned"]
    ):
        group = sums() if sums else world
        measured = exchange({"allsum": measure(group, hidden_size(spec), dtype_of(spec))}, world)[
            0
        ]["allsum"]
        allsum = fit(measured, allsum.transport)
        if rank == 0:
            remember(cfg.cache_dir, key, measured)
            log.info(
                "all_sum on this ring: %.3f ms + %.2f GB/s (%s)",
                allsum.latency_ms,
                allsum.gbytes_s,
                allsum.source,
            )
    plan, caps, kept, choice = plan_mode(
        spec,
        [Capabilities(**r["caps"]) for r in rows],
        lead["hosts"],
        lead["parallel"],
        lead["strategy"],
        lead["kv_tokens"],
        lead["layers"],
        lead["prompt_cache_gb"],
        lead["provisioned"],
        lead["split"],
        allsum,
        blocks=blocks,
    )
    return (
        plan,
        caps,
        with_choice(
            summary(
                spec,
                caps,
                plan,
                lead["kv_tokens"],
                shares=_shares(lead["split"]),
                allsum=allsum,
                kept=kept,
                blocks=blocks,
                ram_cap_gb=lead["prompt_cache_gb"],
            ),
            choice,
        ),
    )


def hidden_size(spec: ModelSpec) -> int:
    """The model's hidden size: one token's hidden state in the dtype the probe measures."""
    return int(spec.hidden_bytes // DTYPE_BYTES.get(dtype_of(spec), 2))


def read_config(folder: Path) -> dict | None:
    """The model's config.json, or None where it cannot be read."""
    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _shares(split: list[ShareSize] | str) -> list[ShareSize] | None:
    return split if isinstance(split, list) else None


def _plain(split: list[ShareSize] | str) -> list[dict] | str:
    """The split as the ranks' exchange carries it (JSON)."""
    return split if isinstance(split, str) else [asdict(p) for p in split]


# --- the dry run ------------------------------------------------------------------------------


def dry_run_inputs(
    cfg: Config,
) -> tuple[ModelSpec, list[Capabilities], list[dict], list[str], Path]:
    """The model's sizes (config.json, or weight headers), each host's capabilities as declared
    in hosts.json or else probed on this machine, each host's hosts.json keys, notes for the
    reader, and the model's folder."""
    model = Path(cfg.model).expanduser() if cfg.model else None
    if model is None or not model.is_dir():
        from mlx_ring.models.source import (
            resolve_model,  # the default model, a .gguf or a repo id
        )

        model = resolve_model(cfg.model, cfg.cache_dir, cfg.weights)
    spec = spec_from_folder(model)
    entries = load_entries(cfg.hostfile)
    caps, probed = [], []
    for i, e in enumerate(entries):
        name = str(e.get("ssh") or f"rank{i}")
        cap = declared(name, e)
        if cap is None:
            from mlx_ring.planning.probe import local_capabilities

            # Each rank's own (its MLX_RING_CAPS entry, e.g. the cores it is pinned to, as check's
            # probes take it); the speed is measured once and read back from the cache for the rest.
            cap = replace(
                local_capabilities(cfg.cache_dir, dtype_of(spec), i),
                host=name,
                source="probed here",
            )
            probed.append(name)
        caps.append(cap)
    notes = (
        [
            f"{', '.join(sorted(set(probed)))}: no memory_gb/tflops/bandwidth_gbs in "
            f"{cfg.hostfile}, so measured on this machine"
        ]
        if probed
        else []
    )
    return spec, caps, [host_keys(e) for e in entries], notes, model


def dry_run(cfg: Config) -> dict:
    """What `./launch.sh plan` prints: the plan the ring would run, each mode's predictions and
    why the mode, the prompt cache's tiers (the disk tier as this machine would size it), and
    every other strategy's pipeline."""
    spec, measured, keys, notes, folder = dry_run_inputs(cfg)
    spec = serving(spec, cfg.prefill_chunk, cfg.max_active)
    entries = load_entries(cfg.hostfile)
    allsum = ring_allsum(cfg.cache_dir, entries)
    if len(entries) > 1 and not allsum.source.startswith("measured"):
        notes.append(
            "the all_sum was not measured on this ring (`./launch.sh check` measures it): tensor "
            f"mode is predicted with the {allsum.source}"
        )
    config = read_config(folder)
    split = shares_or_refusal(config, len(measured))
    blocks = blocks_for(cfg, spec, config)

    def plan(strategy: str, layers=None):
        return plan_for(
            spec, measured, keys, strategy, cfg.kv_tokens, layers, cfg.prompt_cache_gb, None, blocks
        )

    chosen, caps, kept, choice = plan_mode(
        spec,
        measured,
        keys,
        cfg.parallel,
        cfg.strategy,
        cfg.kv_tokens,
        cfg.layers,
        cfg.prompt_cache_gb,
        None,
        split,
        allsum,
        blocks=blocks,
    )
    out = with_choice(
        summary(
            spec,
            caps,
            chosen,
            cfg.kv_tokens,
            shares=_shares(split),
            allsum=allsum,
            kept=kept,
            blocks=blocks,
            ram_cap_gb=cfg.prompt_cache_gb,
        ),
        choice,
    )
    others = {}
    for s in STRATEGIES:
        if s == "custom" or (s == chosen.strategy and chosen.mode == "pipeline"):
            continue
        try:
            p, _, _ = plan(s)
            o = summary(spec, caps, p, cfg.kv_tokens)
            others[s] = {
                "sizes": p.sizes,
                "predicted_tokens_per_s": o["predicted_tokens_per_s"],
                "slowest_stage_ms": o["slowest_stage_ms"],
            }
        except ValueError as e:
            others[s] = {"error": str(e)}
    model = {
        "name": spec.name,
        "n_layers": spec.n_layers,
        "dtype": spec.dtype,
        "layer_gb": round(spec.layer_bytes / GIB, 4),
        "ends_gb": round(spec.ends_bytes / GIB, 3),
        "total_gb": round(spec.total_bytes / GIB, 2),
        "kv_mb_per_token": round(spec.n_layers * spec.kv_bytes_per_token / 2**20, 4),
        "kv_reserve_gb": round(spec.n_layers * layer_kv_bytes(spec, cfg.kv_tokens) / GIB, 3),
    }
    return {
        "model": model,
        "hostfile": str(cfg.hostfile),
        **out,
        "disk_tier": disk_here(
            cfg.prompt_disk_gb, cfg.prompt_disk_floor_gb, cfg.prompt_cache_dir, cfg.cache_dir
        ),
        "other_strategies": others,
        "notes": notes,
    }


def format_dry_run(d: dict) -> str:
    m = d["model"]
    lines = [
        f"model {m['name']}: {m['n_layers']} layers x {m['layer_gb']:.2f} GB + {m['ends_gb']:.2f} "
        f"GB embedding and head = {m['total_gb']:.1f} GB ({m['dtype']}); KV reserve for "
        f"{d['kv_tokens']} tokens: {m['kv_reserve_gb']:.2f} GB",
        f"plan {d['strategy'] if d['mode'] == 'pipeline' else 'tensor'} for {d['hostfile']}:",
        format_summary(d),
        format_disk(d["disk_tier"], d["prompt_cache"]),
    ]
    alt = []
    for s, o in d["other_strategies"].items():
        alt.append(
            f"{s} {'/'.join(map(str, o['sizes']))}: {o['predicted_tokens_per_s']} tokens/s, "
            f"slowest stage {o['slowest_stage_ms']:.1f} ms"
            if "sizes" in o
            else f"{s} does not fit"
        )
    if alt:
        lines.append(
            f"other {'strategies' if d['mode'] == 'pipeline' else 'pipelines'}: " + "; ".join(alt)
        )
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="./launch.sh plan",
        add_help=False,
        description="Print the layer plan for a hostfile and a model, each "
        "mode's predictions and the mode PARALLEL gives or auto chooses, without loading weights.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-h", "--help", action="store_true")
    a, rest = p.parse_known_args(argv)
    if a.help:
        p.print_help()
        print(
            (
                "\nOther flags are server.py's: --model, --hostfile, --parallel, --strategy, "
                "--kv-tokens, --layers, --cache-dir"
            )
        )
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg, _ = parse_config(rest)
        d = dry_run(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(d, indent=1) if a.json else format_dry_run(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
