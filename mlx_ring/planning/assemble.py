"""The one way a ring's layer plan is assembled from its inputs, used by the dry run
(`./launch.sh plan`), the launcher (`./launch.sh start`) and the ranks' startup exchange, so the
three agree: hosts.json's keys over what was measured, ranks on one host sharing it, the prompt
cache set aside, then the split. Pure: no MLX, no files, no network."""

from dataclasses import replace

from mlx_ring.planning.capabilities import Capabilities, colocate, set_aside, with_host_keys
from mlx_ring.planning.plan import LayerPlan, ModelSpec
from mlx_ring.planning.strategies import plan_layers


def serving(spec: ModelSpec, prefill_chunk: int, max_active: int) -> ModelSpec:
    """`spec` with the settings its activations are estimated for (PREFILL_CHUNK,
    0 for auto; MAX_ACTIVE)."""
    return replace(spec, prefill_chunk=prefill_chunk, max_active=max_active)


def ring_caps(
    caps: list[Capabilities], host_keys: list[dict] | None, prompt_cache_gb: float = 0.0
) -> tuple[list[Capabilities], list[float]]:
    """(each rank's capabilities as a plan of either mode takes them, GB each keeps for its
    prompt cache): hosts.json's keys over what was measured, ranks on one host sharing it, the
    cache set aside."""
    if host_keys:
        if len(host_keys) != len(caps):
            raise ValueError(
                f"hosts.json names {len(host_keys)} hosts but the ring has {len(caps)} ranks; "
                "give one entry per rank"
            )
        caps = [with_host_keys(c, k) for c, k in zip(caps, host_keys)]
    return set_aside(colocate(caps), prompt_cache_gb)


def plan_for(
    spec: ModelSpec,
    caps: list[Capabilities],
    host_keys: list[dict] | None,
    strategy: str,
    kv_tokens: int,
    layers: list[int] | tuple[int, ...] | None = None,
    prompt_cache_gb: float = 0.0,
    provisioned: tuple[str, list[int]] | None = None,
) -> tuple[LayerPlan, list[Capabilities], list[float]]:
    """(plan, each rank's capabilities as planned with, GB each rank keeps for its prompt cache).

    `caps` are what each rank measured (or declared), in ring order; `host_keys` each rank's
    hosts.json planning keys, or None to use none. `layers` (LAYERS=) fixes the counts whatever the
    strategy. `provisioned` is (strategy, sizes) of a plan the launcher already shipped weights for:
    it is kept as it is, checked against memory, since each host holds only its slice. ValueError if
    it does not fit.
    """
    caps, kept = ring_caps(caps, host_keys, prompt_cache_gb)
    if provisioned:
        shipped, sizes = provisioned
        return (
            replace(plan_layers(spec, caps, "custom", kv_tokens, list(sizes)), strategy=shipped),
            caps,
            kept,
        )
    sizes = list(layers) if layers else None
    return plan_layers(spec, caps, "custom" if sizes else strategy, kv_tokens, sizes), caps, kept
