"""PARALLEL: the mode a ring runs in (pipeline or tensor), chosen (`auto`) from each mode's
predictions and whether it fits, with the sentence that says why; and the plan of that
mode. Pure, no MLX: the dry run, the launcher and the ranks at startup each decide the same
from the same inputs."""

from dataclasses import dataclass

from mlx_ring.planning.assemble import plan_for, ring_caps
from mlx_ring.planning.capabilities import Capabilities
from mlx_ring.planning.cost import kv_room
from mlx_ring.planning.modes import (
    DEFAULT_ALLSUM,
    PROMPT,
    STREAMS,
    AllSum,
    pipeline_first_token,
    pipeline_tokens_per_s,
    tensor_first_token,
    tensor_kv_room,
    tensor_misfit,
    tensor_tokens_per_s,
)
from mlx_ring.planning.plan import LayerPlan, ModelSpec, tensor_plan
from mlx_ring.planning.promptcache import PLAIN, Blocks, set_aside
from mlx_ring.planning.split import ShareSize, even_sizes, tensor_shares

MODES = ("auto", "pipeline", "tensor")
# tensor mode must beat the pipeline's one stream by this much: host costs are not modelled
MARGIN = 1.1


@dataclass(frozen=True)
class ModeChoice:
    """The mode the ring runs in, the sentence why, and what each mode was predicted to do."""

    mode: str
    reason: str
    modes: dict  # "pipeline" / "tensor" -> prediction (see `predict`)


def predict(
    model: ModelSpec,
    caps: list[Capabilities],
    pipeline: LayerPlan | str,
    split: list[float] | str,
    allsum: AllSum,
    kv_tokens: int,
    links: list[tuple[float, float]] | None = None,
    prompt_cache_gb: float | None = 0.0,
    blocks: Blocks = PLAIN,
) -> dict:
    """Each mode's prediction as plain data: `error` (why it cannot run, "" if it can), decoded
    `tokens_per_s` per number of streams (one: per stream; more: aggregate), `first_token_s` of a
    long prompt, `kv_capacity_tokens` (beside the prompt cache: `promptcache.set_aside`); tensor
    also what its all_sums cost. `pipeline` is the pipeline's plan or why none fits; `split` each
    rank's share in tensor mode, or why the model does not split."""
    n = len(caps)

    def room(plan: LayerPlan, shares=None) -> int:
        held, _ = set_aside(model, caps, plan, kv_tokens, prompt_cache_gb, blocks, shares)
        if shares is None:
            return kv_room(model, held, plan, kv_tokens)
        return tensor_kv_room(model, held, shares, kv_tokens)

    out = {}
    if isinstance(pipeline, LayerPlan):
        out["pipeline"] = {
            "error": "",
            "sizes": pipeline.sizes,
            "tokens_per_s": {
                str(s): round(pipeline_tokens_per_s(model, caps, pipeline, s, links), 2)
                for s in STREAMS
            },
            "first_token_s": round(pipeline_first_token(model, caps, pipeline, PROMPT, links), 3),
            "kv_capacity_tokens": room(pipeline),
        }
    else:
        out["pipeline"] = {"error": pipeline}
    one = allsum.seconds(model.hidden_bytes, n)
    comm = {
        "allsum_ms": round(one * 1e3, 4),
        "allsum_ms_per_token": round(2 * model.n_layers * one * 1e3, 3),
        "allsum_64_ms": round(allsum.seconds(64 * model.hidden_bytes, n) * 1e3, 4),
        "transport": allsum.transport,
        "allsum_from": allsum.source,
    }
    error = (
        "tensor mode needs at least two ranks" if n < 2 else split if isinstance(split, str) else ""
    )
    error = error or tensor_misfit(model, caps, split, kv_tokens)
    if error:
        out["tensor"] = {"error": error, **comm}
    else:
        out["tensor"] = {
            "error": "",
            "shares": [round(s.layer, 4) for s in split],
            "tokens_per_s": {
                str(s): round(tensor_tokens_per_s(model, caps, split, s, allsum), 2)
                for s in STREAMS
            },
            "first_token_s": round(tensor_first_token(model, caps, split, allsum, PROMPT), 3),
            "kv_capacity_tokens": room(tensor_plan(model.n_layers, n), split),
            **comm,
        }
    return out


def decide(parallel: str, n: int, modes: dict, fixed: str = "") -> tuple[str, str]:
    """(mode, the sentence why) for PARALLEL=`parallel` given `predict`'s `modes`. `fixed` names a
    setting that fixes a pipeline's split (LAYERS, a custom strategy): auto keeps the pipeline then.
    ValueError where the mode asked for cannot run."""
    p, t = modes["pipeline"], modes["tensor"]
    if parallel not in MODES:
        raise ValueError(f"PARALLEL={parallel!r} is not known; use one of {', '.join(MODES)}")
    if parallel == "tensor":
        if t["error"]:
            raise ValueError(f"PARALLEL=tensor: {t['error']}; use PARALLEL=auto or pipeline")
        return "tensor", "tensor: PARALLEL=tensor"
    if parallel == "pipeline":
        if p["error"]:
            raise ValueError(p["error"])
        return "pipeline", "pipeline: PARALLEL=pipeline"
    if n < 2:
        return "pipeline", "pipeline: one rank, nothing to share"
    if p["error"] and t["error"]:
        raise ValueError(f"{p['error']}; nor does tensor mode fit: {t['error']}")
    if t["error"]:
        return "pipeline", f"pipeline: {t['error']}"
    if fixed:
        return "pipeline", f"pipeline: {fixed} fixes a pipeline's split"
    link = f"all_sum {t['allsum_ms']:.3g} ms over {t['transport']}"
    if p["error"]:
        return "tensor", f"tensor: the pipeline does not fit ({p['error']})"
    ratio = t["tokens_per_s"]["1"] / p["tokens_per_s"]["1"]
    if ratio >= MARGIN:
        return (
            "tensor",
            f"tensor: {n} ranks, {link}; predicted {ratio:.2f}x the pipeline's one stream",
        )
    if ratio < 1:
        return "pipeline", (
            f"pipeline: {link} would cost {t['allsum_ms_per_token']:.3g} ms a token; tensor mode "
            f"predicted {ratio:.2f}x the pipeline's one stream"
        )
    return "pipeline", (
        f"pipeline: tensor mode predicted only {ratio:.3f}x the pipeline's one stream ({link}), "
        f"under the {MARGIN:.1f}x it must gain to be chosen"
    )


def plan_mode(
    spec: ModelSpec,
    measured: list[Capabilities],
    host_keys: list[dict] | None,
    parallel: str,
    strategy: str,
    kv_tokens: int,
    layers=None,
    prompt_cache_gb: float | None = 0.0,
    provisioned=None,
    split: list[float] | str = "",
    allsum: AllSum | None = None,
    links: list[tuple[float, float]] | None = None,
    blocks: Blocks = PLAIN,
) -> tuple[LayerPlan, list[Capabilities], list[float], ModeChoice]:
    """(plan, each rank's capabilities less its prompt cache, the GB of each rank's RAM tier, the
    choice): the pipeline's plan as `plan_for` makes it or every rank's share of every
    layer, as PARALLEL says. A `provisioned` plan of one stage on several ranks is a tensor
    plan the launcher chose. `prompt_cache_gb` and `blocks`: the prompt cache, as `plan_for`
    takes them."""
    allsum = allsum or DEFAULT_ALLSUM["ring"]
    caps = ring_caps(measured, host_keys)
    n = len(caps)
    # the mode of the plan the launcher provisioned: one stage on several ranks is tensor mode
    shipped = ""
    if provisioned:
        shipped = "tensor" if len(provisioned[1]) == 1 and n > 1 else "pipeline"
        provisioned = provisioned if shipped == "pipeline" else None
    try:
        pipe: LayerPlan | str = plan_for(
            spec, measured, host_keys, strategy, kv_tokens, layers, 0.0, provisioned
        )[0]
    except ValueError as e:
        pipe = str(e)
    shares = split if split != "" else even_sizes(n)
    modes = predict(spec, caps, pipe, shares, allsum, kv_tokens, links, prompt_cache_gb, blocks)
    if shipped:
        mode, reason = decide(shipped, n, modes)  # raises where the shipped mode cannot run here
        try:  # the launcher's reason, where these inputs give its choice; else only that it chose
            again, why = decide(parallel, n, modes)
        except ValueError:
            again = ""
        reason = (
            why
            if again == shipped
            else f"{shipped}: as the launcher planned it (PARALLEL={parallel})"
        )
    else:
        fixed = "LAYERS" if layers else "STRATEGY=custom" if strategy == "custom" else ""
        mode, reason = decide(parallel, n, modes, fixed)
    plan = pipe if mode == "pipeline" else tensor_plan(spec.n_layers, n, strategy)
    held, kept = set_aside(
        spec, caps, plan, kv_tokens, prompt_cache_gb, blocks, None if plan.tensor == 1 else shares
    )
    return plan, held, kept, ModeChoice(mode, reason, modes)


def with_choice(summary: dict, choice: ModeChoice) -> dict:
    """A plan's summary (report.summary) with its mode, why, and each mode's prediction."""
    return {**summary, "mode": choice.mode, "mode_reason": choice.reason, "modes": choice.modes}


def format_modes(modes: dict, reason: str) -> str:
    """Each mode's predictions, a line each, then the choice and why."""
    lines = [
        f"{'mode':<10}{'1 stream':>10}{'16 streams':>12}{'64 streams':>12}"
        f"{f'first token ({PROMPT})':>24}{'KV room':>10}  all_sum"
    ]
    for name in ("pipeline", "tensor"):
        m = modes[name]
        comm = (
            (
                f"{m['allsum_ms']:.3g} ms ({m['allsum_ms_per_token']:.3g} ms a token) "
                f"over {m['transport']}"
            )
            if name == "tensor"
            else "-"
        )
        if m["error"]:
            lines.append(f"{name:<10}{'cannot run: ' + m['error']}")
            continue
        tps = m["tokens_per_s"]
        lines.append(
            f"{name:<10}{tps['1']:>10.2f}{tps['16']:>12.1f}{tps['64']:>12.1f}"
            f"{m['first_token_s']:>22.2f} s{m['kv_capacity_tokens']:>10}  {comm}"
        )
    lines.append(
        (
            "tokens/s decoded: per stream at 1, in aggregate at 16 and 64; all_sum "
            f"{modes['tensor']['allsum_from']}"
        )
    )
    lines.append(f"mode {reason}")
    return "\n".join(lines)


def shares_or_refusal(config: dict | None, n: int) -> list[ShareSize] | str:
    """Each rank's part of every layer, or the sentence why the model does not split `n` ways."""
    if config is None:
        return (
            "the model's config.json was not read, so its heads are not known; "
            "tensor mode needs them"
        )
    try:
        return tensor_shares(config, n)
    except ValueError as e:
        return str(e)
