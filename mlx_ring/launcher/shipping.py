"""The weights a start sends: the pieces each host needs for its ranks, sent to each remote host
over ssh (by its ring address where that takes ssh), with a bar per host."""

import logging
import sys

from tqdm import tqdm

from mlx_ring.hostfile import resolve
from mlx_ring.hosts import provision, ssh
from mlx_ring.hosts.weights import pieces_for
from mlx_ring.launcher.preflight import Preflight, each_host
from mlx_ring.planning.plan import LayerPlan

log = logging.getLogger("up")


def pieces_needed(plan: LayerPlan, ranks: list[tuple[str, int]]) -> dict[str, list[str]]:
    """The weight pieces each host needs for its ranks (ssh name, rank): their layers, and the ends
    on rank 0's host. In tensor mode every rank cuts its share of every layer from the whole
    tensors, and holds the ends: every host needs them all."""
    needed: dict[str, list[str]] = {}
    for name, rank in ranks:
        s, e = plan.ranges[plan.stage_of(rank)]
        needed.setdefault(name, []).extend(pieces_for(range(s, e), rank == 0 or plan.tensor > 1))
    return needed


def send_weights(ring: Preflight) -> dict:
    """Each remote host's slice; what was sent, per host."""
    cache = ring.opts.remote_cache
    needed = pieces_needed(ring.plan, [(h.ssh, h.rank) for h in ring.hosts])
    address = {}  # ssh name -> its first rank's ring address
    for h in ring.hosts:
        address.setdefault(h.ssh, h.address)
    sent = {}

    names = sorted(needed)

    def ship(name: str) -> str:
        want = sorted(set(needed[name]))
        held = sum(ring.manifest["pieces"][g]["size"] for g in want)
        # A bar per host on a terminal (nothing otherwise): the most it may send is its whole slice.
        via = ssh.bulk_route(ring.conf, name, address[name], resolve)

        def send(route):
            with tqdm(
                total=held,
                desc=f"{name} weights",
                unit="B",
                unit_scale=True,
                position=names.index(name),
                leave=False,
                disable=None,
                file=sys.stderr,
            ) as bar:
                return provision.timed(
                    provision.send_pieces,
                    ring.conf,
                    ring.facts[name],
                    ring.model,
                    ring.manifest,
                    want,
                    cache,
                    bar.update,
                    route,
                )

        try:
            n, t = send(via)
        except ssh.SshError as e:
            if via is None:
                raise
            log.info(
                (
                    "%s: its ring address %s does not take ssh (%s); sending its weights "
                    "the way ssh reaches it"
                ),
                name,
                via,
                e,
            )
            n, t, via = *send(None), None
        sent[name] = {
            "bytes_sent": n,
            "slice_bytes": held,
            "seconds": round(t, 2),
            "via": via or name,
        }
        return (
            f"{name}: weights {n / 1e6:.1f} MB sent in {t:.1f} s{f' over {via}' if via else ''} "
            f"(its slice: {len(want)} pieces, {held / 1e6:.1f} "
            f"MB{'; the rest was there' if n < held else ''})"
        )

    for line in each_host(ring, ship).values():
        log.info("%s", line)
    return sent
