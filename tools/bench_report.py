"""bench.py's report: `bench.json`, the tables of `bench.md` (each ring against one rank and the
replicas) and `throughput.png`.
"""

import json
from pathlib import Path


def ratios(results: list[dict]) -> list[str]:
    """Markdown lines: each ring's aggregate over one rank's, and over the replicas' (the
    ceiling), by concurrency; none without a one-rank ring."""
    agg = {r["target"]: {x["concurrency"]: x["aggregate_tps"] for x in r["runs"]} for r in results}
    base, ceiling = (
        agg.get("ring-1"),
        next((v for k, v in agg.items() if k.startswith("replicas-")), None),
    )
    rings = [k for k in agg if k.startswith(("ring-", "tensor-")) and k != "ring-1"]
    if base is None or not rings:
        return []
    cols = [("ring-1", base)] + ([("replicas", ceiling)] if ceiling else [])
    lines = [
        "",
        "| target | concurrency | "
        + " | ".join(f"aggregate over {name}" for name, _ in cols)
        + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for k in rings:
        for c, v in agg[k].items():
            cells = [f"{v / d[c]:.2f}x" if d.get(c) else "-" for _, d in cols]
            lines.append(f"| {k} | {c} | " + " | ".join(cells) + " |")
    return lines


def report(results: list[dict], meta: dict, out: Path) -> None:
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [
        f"Model `{meta['model']}` on {meta['machine']}; {meta['max_tokens']} tokens per "
        "stream, temperature 0.",
        "",
        "| target | concurrency | aggregate tok/s | per-stream tok/s | TTFT mean s | ITL p50 "
        "ms | ITL p99 ms | failed streams | busy per rank |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda x, d=1: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in results:
        for run in r["runs"]:
            lines.append(
                f"| {r['target']} | {run['concurrency']} | {f(run['aggregate_tps'])} | "
                f"{f(run['per_stream_decode_tps'])} | {f(run['ttft_s_mean'], 2)} | "
                f"{f(run['itl_p50_ms'])} | {f(run['itl_p99_ms'])} | {run['errors']} | "
                f"{' / '.join(f'{b:.0%}' for b in run.get('busy', [])) or '-'} |"
            )
    lines += ratios(results)
    lines += [
        "",
        "| target | TTFT short s | TTFT long s | peak memory per rank (MiB) |",
        "|---|---|---|---|",
    ]
    for r in results:
        mem = "; ".join(
            f"r{m['rank']}: "
            + ", ".join(f"{k.removesuffix('_mib')} {v:.0f}" for k, v in m.items() if k != "rank")
            for m in r["memory"]
        )
        lines.append(
            f"| {r['target']} | {f(r['ttft_short_s'], 3)} | {f(r.get('ttft_long_s'), 2)} | {mem} |"
        )
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        ax.plot(
            [x["concurrency"] for x in r["runs"]],
            [x["aggregate_tps"] for x in r["runs"]],
            marker="o",
            label=r["target"],
        )
    ax.set(
        xlabel="concurrent streams",
        ylabel="aggregate tokens/s",
        title=f"{meta['model']} on {meta['machine']}",
    )
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    print((out / "bench.md").read_text())
