"""The one way a ring's layer plan is assembled from its inputs, used by the dry run
(`./launch.sh plan`), the launcher (`./launch.sh start`) and the ranks' startup exchange, so the
three agree: hosts.json's keys over what was measured, ranks on one host sharing it, the split,
then the prompt cache set aside out of what the split leaves (promptcache.py). Pure: no MLX, no
files, no network."""

from dataclasses import replace

from mlx_ring.planning.capabilities import Capabilities, colocate, with_host_keys
from mlx_ring.planning.plan import LayerPlan, ModelSpec
from mlx_ring.planning.promptcache import PLAIN, Blocks, set_aside
from mlx_ring.planning.strategies import plan_layers


def serving(spec: ModelSpec, prefill_chunk: int, max_active: int) -> ModelSpec:
    """`spec` with the settings its activations are estimated for (PREFILL_CHUNK,
    0 for auto; MAX_ACTIVE)."""
    return replace(spec, prefill_chunk=prefill_chunk, max_active=max_active)


def ring_caps(caps: list[Capabilities], host_keys: list[dict] | None) -> list[Capabilities]:
    """Each rank's capabilities as a plan of either mode splits the layers by: hosts.json's keys
    over what was measured, ranks on one host sharing it."""
    if host_keys:
        if len(host_keys) != len(caps):
            raise ValueError(
                f"hosts.json names {len(host_keys)} hosts but the ring has {len(caps)} ranks; "
                "give one entry per rank"
            )
        caps = [with_host_keys(c, k) for c, k in zip(caps, host_keys)]
    return colocate(caps)


def plan_for(
    spec: ModelSpec,
    caps: list[Capabilities],
    host_keys: list[dict] | None,
    strategy: str,
    kv_tokens: int,
    layers: list[int] | tuple[int, ...] | None = None,
    prompt_cache_gb: float | None = 0.0,
    provisioned: tuple[str, list[int]] | None = None,
    blocks: Blocks = PLAIN,
) -> tuple[LayerPlan, list[Capabilities], list[float]]:
    """(plan, each rank's capabilities less its prompt cache, the GB of each rank's RAM tier).

    `caps` are what each rank measured (or declared), in ring order; `host_keys` each rank's
    hosts.json planning keys, or None to use none. `layers` (LAYERS=) fixes the counts whatever the
    strategy. `provisioned` is (strategy, sizes) of a plan the launcher already shipped weights for:
    it is kept as it is, checked against memory, since each host holds only its slice. ValueError if
    it does not fit. `prompt_cache_gb` (PROMPT_CACHE_GB: None for auto) caps each rank's RAM tier
    and `blocks` says how the blocks are kept (the disk tier, KV_BITS): `promptcache.set_aside`.
    """
    caps = ring_caps(caps, host_keys)
    if provisioned:
        shipped, sizes = provisioned
        plan = replace(plan_layers(spec, caps, "custom", kv_tokens, list(sizes)), strategy=shipped)
    else:
        sizes = list(layers) if layers else None
        plan = plan_layers(spec, caps, "custom" if sizes else strategy, kv_tokens, sizes)
    return plan, *set_aside(spec, caps, plan, kv_tokens, prompt_cache_gb, blocks)
