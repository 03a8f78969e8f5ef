"""A coding agent's session replayed against the server: Claude Code's request shape (its system
prompt, tools and a new billing line every turn), each turn the last answer, a tool result of
500-2,000 tokens and a short question more, until the prompt reaches `--context` tokens. Per turn:
the prompt's tokens, those reused from the prompt cache, those prefilled, the time to the first
token and the time to prefill only the new tokens (agent_report.METHOD says how it is derived).

    .venv/bin/python tools/bench_agent.py --ranks 2 --context 5000

Ours goes through `/v1/messages` (streamed, the `anthropic` client), in the configurations asked
for (all by default): as configured; `--small-ram` (the RAM tier holds a tenth of the session, as
a 70B model's on 3 Macs would); `--restart-at K` (the ring stopped and started again after turn
K, the same CACHE_DIR kept for the cache's disk tier); `--cache-off` (every turn prefilled whole).
Each configuration has a fresh CACHE_DIR. `--peers mlx_lm` adds single-process mlx_lm.server on
the same conversation as OpenAI chat. Greedy answers are checked against the cache-off run's.

Writes `agent.json` and `agent.md` to `--out`.
"""

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
from agent_report import CACHE_OFF, add_new_only, mark_answers, markdown  # noqa: E402
from agent_session import Session, capture, openai_body, pick_tools  # noqa: E402
from bench_targets import ROOT, ring_target, targets  # noqa: E402
from openai import OpenAI

TOOLS_TEMPLATE = ROOT / "tests" / "data" / "tools_chat_template.jinja"


def anthropic_turn(url: str, body: dict) -> dict:
    """One streamed turn through /v1/messages: the time to the first content delta (text or a
    tool call's), the usage the stream reports and the answer's content blocks."""
    client = anthropic.Anthropic(base_url=url, api_key="bench", timeout=3600, max_retries=0)
    fields = dict(body)
    extra = {k: fields.pop(k) for k in ("temperature", "context_management")}
    t0, first, blocks, usage = time.perf_counter(), None, [], {}
    for ev in client.messages.create(stream=True, extra_body=extra, **fields):
        if ev.type == "message_start":
            usage = ev.message.usage.model_dump()
        elif ev.type == "content_block_start":
            b = ev.content_block
            if b.type == "tool_use":
                first = first or time.perf_counter()
                blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": ""})
            else:
                blocks.append({"type": "text", "text": ""})
        elif ev.type == "content_block_delta":
            first = first or time.perf_counter()
            if ev.delta.type == "text_delta":
                blocks[-1]["text"] += ev.delta.text
            elif ev.delta.type == "input_json_delta":
                blocks[-1]["input"] += ev.delta.partial_json
        elif ev.type == "message_delta":
            usage |= {k: v for k, v in ev.usage.model_dump().items() if v is not None}
    # Our input_tokens already leave out what the cache read (api/anthropic.py's usage).
    cached, fresh = usage.get("cache_read_input_tokens") or 0, usage["input_tokens"]
    return {
        "ttft_s": (first or time.perf_counter()) - t0,
        "prompt_tokens": fresh + cached,
        "reused": cached,
        "prefilled": fresh,
        "output_tokens": usage.get("output_tokens") or 0,
    } | answer_of(blocks)


def answer_of(blocks: list[dict]) -> dict:
    """The content blocks as the next turn sends them back (a call's input parsed), and the answer
    as one text to compare."""
    for b in blocks:
        if b["type"] == "tool_use":
            try:
                b["input"] = json.loads(b["input"] or "{}")
            except json.JSONDecodeError:  # cut by max_tokens
                b["input"] = {}
            b["input"] = b["input"] if isinstance(b["input"], dict) else {}
    text = "".join(b.get("text", "") for b in blocks) + "".join(
        f"\n[{b['name']} {json.dumps(b['input'])}]" for b in blocks if b["type"] == "tool_use"
    )
    return {"answer": text, "blocks": blocks}


def openai_turn(url: str, model: str, body: dict) -> dict:
    """The same turn as a streamed OpenAI chat completion (mlx_lm.server): the usage it sends at
    the end, its `cached_tokens` where it has them."""
    client = OpenAI(base_url=url + "/v1", api_key="bench", timeout=3600, max_retries=0)
    chat = openai_body(body) | {"model": model}
    t0, first, text, calls, usage = time.perf_counter(), None, "", {}, None
    for chunk in client.chat.completions.create(
        **chat, stream=True, stream_options={"include_usage": True}
    ):
        usage = chunk.usage or usage
        d = chunk.choices[0].delta if chunk.choices else None
        if d is None or not (d.content or d.tool_calls):
            continue
        first = first or time.perf_counter()
        text += d.content or ""
        for tc in d.tool_calls or []:
            # mlx_lm.server sends each call whole, without an index
            key = len(calls) if tc.index is None else tc.index
            c = calls.setdefault(key, {"id": tc.id or f"toolu_{key}", "name": ""})
            c["name"] += (tc.function and tc.function.name) or ""
            c["input"] = c.get("input", "") + ((tc.function and tc.function.arguments) or "")
    details = usage.prompt_tokens_details if usage else None
    cached = details.cached_tokens if details else None
    blocks = ([{"type": "text", "text": text}] if text else []) + [
        {"type": "tool_use"} | c for c in calls.values()
    ]
    return {
        "ttft_s": (first or time.perf_counter()) - t0,
        "prompt_tokens": usage.prompt_tokens,
        "reused": cached,
        "prefilled": None if cached is None else usage.prompt_tokens - cached,
        "output_tokens": usage.completion_tokens,
    } | answer_of(blocks)


def rank0_prefill(url: str) -> int:
    return httpx.get(url + "/cluster/status", timeout=60).json()["ranks"][0]["prefill_tokens"]


def replay(a, start, ask, ours: bool, restart_at: int | None, session: Session) -> list[dict]:
    """The session turn by turn on the target `start()` makes (started again after turn
    `restart_at`), until its next prompt would pass --context or --turns are done."""
    turns, t = [], start(0).__enter__()
    try:
        for k in range(1, (a.turns or 10**6) + 1):
            restarted = k - 1 == restart_at
            if restarted:
                t, stopped = None, t
                stopped.__exit__(None, None, None)
                t = start(1).__enter__()
            before = rank0_prefill(t.url) if ours else None
            r = ask(t.url, session.body(a.max_tokens))
            if ours:
                r["rank0_prefilled"] = rank0_prefill(t.url) - before
            r |= {"turn": k, "restarted_before": restarted}
            turns.append(r)
            print(
                f"{t.name} turn {k}: {r['prompt_tokens']} tokens, {r['reused']} reused, first "
                f"token after {r['ttft_s']:.2f} s",
                flush=True,
            )
            added = session.advance(r.pop("blocks"))
            if r["prompt_tokens"] + r["output_tokens"] + added + a.max_tokens > a.context:
                break
        if restart_at is not None and len(turns) <= restart_at:
            print(f"the session ended after turn {len(turns)}, before the restart", flush=True)
        if ours:
            turns[-1]["prompt_cache"] = httpx.get(t.url + "/cluster/status", timeout=60).json()[
                "prompt_cache"
            ]
    finally:
        if t is not None:
            t.__exit__(None, None, None)
    return turns


def configurations(a, kv_bytes_per_token: float) -> list[tuple[str, dict, int | None]]:
    """(name, settings, restart_at) of each of our runs asked for, all when none is."""
    every = not (a.configured or a.small_ram or a.restart_at or a.cache_off)
    ram = {"PROMPT_CACHE_GB": a.cache_gb} if a.cache_gb is not None else {}
    disk = {"PROMPT_DISK_GB": a.disk_gb} if a.disk_gb is not None else {}
    # A tenth of the session's KV, on the rank holding the most layers.
    small = kv_bytes_per_token * math.ceil(a.layers / a.ranks) * a.context / 10 / 2**30
    out = []
    if every or a.configured:
        out.append(("configured", ram | disk, None))
    if every or a.small_ram:
        out.append(("small-ram", {"PROMPT_CACHE_GB": f"{small:.6g}"} | disk, None))
    if every or a.restart_at:
        out.append((f"restart-at-{a.restart_at or 2}", ram | disk, a.restart_at or 2))
    if every or a.cache_off:
        out.append((CACHE_OFF, {"PROMPT_CACHE_GB": "0", "PROMPT_DISK_GB": "0"}, None))
    return out


def fresh_cache_dir(name: str) -> Path:
    """An empty CACHE_DIR but for this machine's speed measurements, so the ring starts with the
    same plan as always and no blocks of another run."""
    from mlx_ring.config import CACHE_DIR

    d = Path(tempfile.mkdtemp(prefix=f"bench-agent-{name}-"))
    home = Path(os.environ.get("CACHE_DIR", CACHE_DIR)).expanduser()
    for f in ("probe.json", "allsum.json"):
        if (home / f).is_file():
            shutil.copy(home / f, d / f)
    return d


def with_tool_template(model_dir: Path, tmp: Path) -> Path:
    """`model_dir`, or where its chat template offers no tools (the default model's), a linked copy
    under the tests' Qwen2.5-style tools template: a body with tools is refused without one."""
    from mlx_lm.utils import load_tokenizer

    if load_tokenizer(model_dir).has_tool_calling:
        return model_dir
    out = tmp / model_dir.name
    out.mkdir()
    for f in model_dir.iterdir():
        if f.name != "chat_template.jinja":
            (out / f.name).symlink_to(f.resolve())
    (out / "chat_template.jinja").write_text(TOOLS_TEMPLATE.read_text())
    return out


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    return git("rev-parse", "--short", "HEAD").strip() + ("-dirty" if git("status", "-s") else "")


def machine() -> str:
    cpu = Path("/proc/cpuinfo")
    lines = cpu.read_text().splitlines() if cpu.is_file() else []
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{platform.machine()} {names[0] if names else platform.processor()}, " + (
        f"{os.cpu_count()} cores"
    )


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="MLX model folder (default: the default model)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--context", type=int, default=None, help="default: 7/8 of the model's")
    p.add_argument("--turns", type=int, default=None, help="at most this many turns")
    p.add_argument("--tools", type=int, default=None, help="default: those fitting half --context")
    p.add_argument("--skills", action="store_true", help="add Claude Code's agent and skill list")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (greedy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configured", action="store_true", help="ours as configured")
    p.add_argument("--small-ram", action="store_true", help="RAM tier a tenth of the session")
    p.add_argument("--restart-at", type=int, default=None, metavar="K")
    p.add_argument("--cache-off", action="store_true", help="PROMPT_CACHE_GB=0 PROMPT_DISK_GB=0")
    p.add_argument("--cache-gb", default=None, help="PROMPT_CACHE_GB (default: the server's)")
    p.add_argument("--disk-gb", default=None, help="PROMPT_DISK_GB (default: the server's)")
    p.add_argument("--peers", default="mlx_lm", help="mlx_lm, or '' for ours alone")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    return p.parse_args()


def ours(a, served: Path, session, runs: list[dict], save) -> None:
    """Each configuration of ours asked for, replayed on a fresh CACHE_DIR, added to `runs`."""
    for name, settings, restart_at in configurations(a, a.kv_bytes_per_token):
        cache_dir = fresh_cache_dir(name)
        env = {"CACHE_DIR": str(cache_dir)} | {k: str(v) for k, v in settings.items()}

        def start(i: int, name=name, env=env):
            return ring_target(a, served, f"{name}-{i}" if i else name, a.ranks, [], env)

        try:
            turns = replay(a, start, anthropic_turn, True, restart_at, session())
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        runs.append(
            {"name": name, "target": f"ring, {a.ranks} ranks", "ours": True}
            | {"settings": settings, "restart_at": restart_at, "turns": turns}
        )
        save()


def peers(a, served: Path, session, runs: list[dict], save) -> None:
    """mlx_lm.server (--peers) on the same session as OpenAI chat, added to `runs`."""
    b = argparse.Namespace(**vars(a))
    b.ranks, b.tensor, b.peers = [], [], [x for x in a.peers.split(",") if x]
    for t in targets(b, served):

        def ask(url: str, body: dict) -> dict:
            return openai_turn(url, str(served), body)

        runs.append(
            {"name": t.name, "target": "mlx_lm.server", "ours": False, "settings": {}}
            | {
                "restart_at": None,
                "turns": replay(a, lambda i, t=t: t, ask, False, None, session()),
            }
        )
        save()


def main():
    a = parse()
    if a.model is None:
        from mlx_ring.config import CACHE_DIR
        from mlx_ring.models.source import resolve_model

        a.model = str(resolve_model(None, CACHE_DIR, "auto"))
    from transformers import AutoTokenizer

    from mlx_ring.models.shape import read_shape
    from mlx_ring.planning.sizes import spec_from_folder

    model_dir = Path(a.model)
    shape = read_shape(json.loads((model_dir / "config.json").read_text()))
    spec = spec_from_folder(model_dir)  # the KV bytes as the server counts them
    a.context = a.context or shape.context_length * 7 // 8
    a.layers, a.kv_bytes_per_token = spec.n_layers, spec.kv_bytes_per_token
    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    body = capture()
    first = body["system"][1:] + body["messages"][0]["content"]
    fixed = count("".join(b["text"] for b in first))
    tools = pick_tools(body["tools"], a.tools, a.context // 2 - fixed, count)

    def session() -> Session:
        return Session(body, tools, a.seed, count, a.skills)

    # What bench_targets reads: one stream at a time, no pinning, mlx_lm's answer cap.
    a.concurrency, a.gpu, a.server_args, a.pin, a.shares, a.most = [1], False, [], False, [], 1
    a.out.mkdir(parents=True, exist_ok=True)
    (ROOT / "bench-results").mkdir(exist_ok=True)
    meta = {
        "model": model_dir.name,
        "template": None,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "argv": sys.argv[1:],
        "ranks": a.ranks,
        "context": a.context,
        "max_tokens": a.max_tokens,
        "seed": a.seed,
        "tools": len(tools),
        "tool_names": [t["name"] for t in tools],
        "kv_bytes_per_token": spec.kv_bytes_per_token * spec.n_layers,
    }
    runs = []

    def save():  # after every configuration: a long run's results so far stay readable
        (a.out / "agent.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))

    # a bench stopped by SIGTERM (a timeout) still stops the servers it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="bench-agent-model-") as tmp:
        served = with_tool_template(model_dir, Path(tmp))
        if served != model_dir:
            meta["template"] = str(TOOLS_TEMPLATE.relative_to(ROOT))
        ours(a, served, session, runs, save)
        peers(a, served, session, runs, save)
    add_new_only(runs)
    mark_answers(runs)
    save()
    text = markdown(meta, runs)
    (a.out / "agent.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
