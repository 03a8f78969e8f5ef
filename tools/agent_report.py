"""bench_agent.py's report: each turn's time to prefill only its new tokens, the answers set against
the cache-off run's, and `agent.md`'s tables (one per configuration).
"""

import bisect

CACHE_OFF = "cache-off"
METHOD = (
    "new-only = the turn's prefilled tokens x the seconds per prompt token of a prompt of the "
    "same length prefilled whole: the cache-off run's TTFT / prompt tokens, interpolated by "
    "prompt length (a configuration without one there: its own turn 1). It counts the request's "
    "overhead and the first token's decode step in proportion, and sets a late token at the "
    "prompt's average cost, a little under what it costs (attention grows with position)."
)


def seconds_per_token(points: list[tuple[int, float]]):
    """`f(prompt_tokens)`: the seconds per token of whole prefills, linear between `points`
    (prompt tokens, TTFT) and flat beyond them; None without points."""
    pts = sorted((p, t / p) for p, t in points if p > 0)
    if not pts:
        return None
    xs = [p for p, _ in pts]

    def f(n: int) -> float:
        i = bisect.bisect_left(xs, n)
        if i == 0:
            return pts[0][1]
        if i == len(pts):
            return pts[-1][1]
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)

    return f


def add_new_only(configs: list[dict]) -> None:
    """Each turn's `new_only_s` and `ratio` (TTFT over it), each configuration's `rate_from`.
    Ours use the cache-off run's whole prefills; another server its own turn 1."""
    off = next((c for c in configs if c["name"] == CACHE_OFF), None)
    for c in configs:
        if off is not None and c["ours"]:
            ref, c["rate_from"] = off["turns"], CACHE_OFF
        else:
            ref, c["rate_from"] = c["turns"][:1], "its turn 1"
        f = seconds_per_token([(t["prompt_tokens"], t["ttft_s"]) for t in ref])
        for t in c["turns"]:
            known = f is not None and t["prefilled"] is not None
            t["new_only_s"] = t["prefilled"] * f(t["prompt_tokens"]) if known else None
            t["ratio"] = t["ttft_s"] / t["new_only_s"] if t["new_only_s"] else None


def mark_answers(configs: list[dict]) -> None:
    """Each of our turns' `same_answer`: whether its greedy answer is the cache-off run's (None:
    no cache-off run, or no such turn there). Once one differs, the conversations differ too."""
    off = next((c for c in configs if c["name"] == CACHE_OFF), None)
    for c in configs:
        for i, t in enumerate(c["turns"]):
            there = off["turns"][i] if off and c["ours"] and i < len(off["turns"]) else None
            t["same_answer"] = None if there is None else t["answer"] == there["answer"]


def _cell(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def table(c: dict) -> list[str]:
    """Markdown lines of one configuration: a heading with its settings, then a row a turn."""
    settings = ", ".join(f"{k}={v}" for k, v in c["settings"].items())
    settings = settings or ("as configured" if c["ours"] else "its defaults")
    # what the server made of the settings: its prompt cache's budget at the end
    budget = (c["turns"][-1].get("prompt_cache") or {}).get("budget_tokens") if c["turns"] else None
    if budget is not None:
        settings += f"; a prompt cache of {budget} tokens"
    lines = [
        f"### {c['name']} ({c['target']}; {settings})",
        "",
        "| turn | prompt tokens | reused | prefilled | TTFT s | new-only prefill s | "
        "TTFT / new-only | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in c["turns"]:
        notes = (["after the restart"] if t.get("restarted_before") else []) + (
            ["answer differs from cache off"] if t.get("same_answer") is False else []
        )
        lines.append(
            f"| {t['turn']} | {t['prompt_tokens']} | {_cell(t['reused'], 'd')} | "
            f"{_cell(t['prefilled'], 'd')} | {t['ttft_s']:.2f} | {_cell(t['new_only_s'], '.2f')} | "
            f"{_cell(t['ratio'], '.2f')} | {'; '.join(notes)} |"
        )
    return lines


def markdown(meta: dict, configs: list[dict]) -> str:
    """agent.md: where and how it ran, the method, then one table per configuration."""
    head = [
        f"Model {meta['model']}, {meta['machine']}, {meta['date']}, commit {meta['commit']}; "
        f"`{' '.join(['tools/bench_agent.py', *meta['argv']])}`",
        "",
        f"A Claude Code session ({meta['tools']} of its tools: "
        f"{', '.join(meta.get('tool_names', []))}) replayed turn by turn, "
        f"{meta['max_tokens']} greedy tokens an answer. {METHOD} The configurations run one "
        "after another: where other work shares the machine, its load moves their ratios.",
        "",
    ]
    if meta.get("template"):
        head += [
            f"The model's chat template offers no tools: it ran under {meta['template']} "
            "(Qwen2.5's way), which puts the tools into the system prompt.",
            "",
        ]
    if any(not c["ours"] for c in configs):
        head += [
            "mlx_lm.server has no Anthropic route: it got the same conversation as OpenAI chat, "
            "the system blocks in one message without Claude Code's billing line (it cannot leave "
            "the line out itself); its reused column is its `cached_tokens`, empty where it sends "
            "none.",
            "",
        ]
    differs = [c["name"] for c in configs if any(t["same_answer"] is False for t in c["turns"])]
    if differs:
        head += [f"Answers differ from the cache-off run's in: {', '.join(differs)}.", ""]
    body = []
    for c in configs:
        body += table(c) + [""]
    return "\n".join(head + body)
