"""What a failed ring's output says went wrong, in sentences that name the cause and what to do:
a rank whose GPU failed a step (its line, exits.gpu_failure), Metal's command-buffer errors
(gpu.metal_failure) and MLX's ring connect failures (`[ring] Couldn't connect (error: N)`, with
the Local Network hint where the rank that failed runs on a Mac)."""

import re

from mlx_ring import exits
from mlx_ring.gpu import metal_failure, metal_named
from mlx_ring.platform import connect_error, ranks_local_network_hint

# MLX 0.32's wording, and the newer one that tries every resolved address; world.init_world
# prefixes it with the rank and the address it was connecting to.
CONNECT = (
    r"\[ring\] Couldn't connect(?: to any resolved address)? \((?:last )?error: (?P<errno>\d+)\)"
)
RING_CONNECT = re.compile(CONNECT)
JOINING = re.compile(
    (
        r"rank (?P<rank>\d+) could not join the ring \(its next rank, (?P<next>\d+), "
        r"at (?P<at>[^)]*)\): "
    )
    + CONNECT
)


def ring_connect_failure(output: str) -> str | None:
    """MLX's failed ring connect in a rank's `output`, named with its meaning and what to do; None
    where there is none."""
    m = JOINING.search(output) or RING_CONNECT.search(output)
    if not m:
        return None
    system, meaning = connect_error(int(m.group("errno")))
    who = (
        f"rank {m.group('rank')} could not connect to rank {m.group('next')} at {m.group('at')}"
        if "rank" in m.groupdict()
        else "a rank could not connect to the next rank"
    )
    said = f"{who} ({meaning}; MLX: {RING_CONNECT.search(m.group(0)).group(0)})"
    if meaning == "connection refused":
        todo = "the next rank was not listening: its log says why it did not start"
    elif meaning == "timed out":
        todo = (
            "a firewall may drop the ring's connections (`./launch.sh check` tells), or the "
            "address is not reachable from the rank before it"
        )
    else:
        todo = (
            "check that both hosts' ring addresses in hosts.json are on a link they share "
            "(`./launch.sh check`)"
        )
        if system == "Darwin":
            todo += f"; or {ranks_local_network_hint()}"
    return f"{said}: {todo}"


JACCL_JOIN = re.compile(
    r"rank (?P<rank>\d+) could not join the JACCL ring \((?P<how>[^)]*)\): (?P<why>[^\n]*)"
)


def jaccl_join_failure(output: str) -> str | None:
    """A rank that could not start JACCL, with what to look at; None where there is none."""
    m = JACCL_JOIN.search(output)
    if not m:
        return None
    return (
        f"rank {m.group('rank')} could not join the JACCL ring ({m.group('how')}; MLX: "
        f"{m.group('why').strip()}): `./launch.sh check` lists each Mac's RDMA devices; RDMA must "
        "be on at both ends of each cable (`rdma_ctl enable` in macOS Recovery), and every Mac "
        "must reach the coordinator's address"
    )


# A JACCL worker that timed out a wait on its neighbour (ring/deadline.py) says which
# rank it waited on.
DEADLINE = re.compile(r"ring deadline: (?P<why>[^\n]*?); leaving")


def deadline_failure(output: str) -> str | None:
    """The first wait a rank timed out, as it named it; None where there is none."""
    m = DEADLINE.search(output)
    return m.group("why") if m else None


def rank_on(rank: int, hosts: list[str]) -> str:
    """`rank N on HOST` (`rank N` for one on this machine), as the launcher names a rank."""
    host = hosts[rank] if rank < len(hosts) else "127.0.0.1"
    return f"rank {rank}" + (f" on {host}" if host != "127.0.0.1" else "")


def gpu_failed(output: str, hosts: list[str] = ()) -> list[str]:
    """Each rank whose GPU failed a step, as its own line said it (it then exited DEVICE_FAILED),
    named with its host (`hosts`: by rank), the cause and what to do."""
    said = []
    for rank, words in sorted(exits.gpu_failures(output).items()):
        named = metal_named(words)
        said.append(
            f"{rank_on(rank, hosts)}: the GPU failed a command buffer ({named[0]}): {named[1]}"
            if named
            else f"{rank_on(rank, hosts)}: the GPU failed a kernel ({words}): the GPU's context is "
            "lost with what it computed; the ring restarts; if it recurs, report it with the "
            "model and the rank logs"
        )
    return said


def explain(output: str, hosts: list[str] = ()) -> list[str]:
    """Every cause the ranks' `output` names, each a sentence with its fix; `hosts`: the ranks'
    hosts, by rank, to name them."""
    gpus = gpu_failed(output, hosts)
    return [
        *gpus,
        *(
            s
            for s in (
                None if gpus else metal_failure(output),  # a rank that aborted with it
                ring_connect_failure(output),
                jaccl_join_failure(output),
                deadline_failure(output),
            )
            if s
        ),
    ]
