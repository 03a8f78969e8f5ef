"""hosts.json's entries as read from disk: one JSON object per rank, in ring order, checked for shape.
The file is that list, or the object MLX's `mlx.distributed_config --output-hostfile` writes (the
list under "hosts", with "backend" and "envs", the variables every rank gets).

Planning reads the planning keys from them; hosts/ resolves their addresses (hosts/hostfile.py).
"""

from pathlib import Path

from mlx_ring.config import check_objects, read_json
from mlx_ring.planning.capabilities import HOST_KEYS

KNOWN_KEYS = ("ssh", "ips", "rdma", *HOST_KEYS)
EXAMPLE = '[{"ssh": "mac-a.local", "ips": ["192.168.1.10"]}, {"ssh": "mac-b.local", "ips": ["192.168.1.11"]}]'


def read_hostfile(path: Path) -> tuple[list[dict], list[str]]:
    """The hostfile's entries (one per rank, ring order), checked for shape, and its "envs" (MLX's form:
    "NAME=value" strings, for every rank; none in a plain list)."""
    data, envs = read_json(path, "the hostfile", EXAMPLE), []
    if isinstance(data, dict) and "hosts" in data:  # as mlx.distributed_config writes it
        unknown = sorted(set(data) - {"backend", "envs", "hosts"})
        if unknown:
            raise ValueError(f"the hostfile {path} has unknown key(s) {', '.join(unknown)}; MLX's hostfile has "
                             "backend, envs and hosts")
        if data.get("backend") not in ("", "ring", None):
            raise ValueError(f"the hostfile {path} is for MLX's {data['backend']!r} backend, but this ring runs MLX's "
                             "ring backend; write it with `mlx.distributed_config --backend ring`, or drop \"backend\"")
        envs = data.get("envs") or []
        if not isinstance(envs, list) or not all(isinstance(e, str) and "=" in e.strip("=") for e in envs):
            raise ValueError(f"the hostfile {path}: \"envs\" must be a list of \"NAME=value\" strings, e.g. "
                             '["MLX_METAL_FAST_SYNCH=1"]')
        data = data["hosts"]
    return _check_entries(path, check_objects(data, path, "the hostfile", EXAMPLE, KNOWN_KEYS)), envs


def load_entries(path: Path) -> list[dict]:
    """The hostfile's entries (one per rank, ring order), checked for shape."""
    return read_hostfile(path)[0]


def _check_entries(path: Path, entries: list[dict]) -> list[dict]:
    for i, e in enumerate(entries):
        where = f"{path}: entry {i}"
        if not isinstance(e.get("ssh"), str) or not e["ssh"].strip():
            raise ValueError(f"{where} lacks \"ssh\", the name to ssh into (\"127.0.0.1\" for this machine), e.g. {EXAMPLE}")
        ips = e.get("ips")
        if not isinstance(ips, list) or not ips or not all(isinstance(a, str) and a.strip() for a in ips):
            raise ValueError(f"{where} ({e['ssh']}) lacks \"ips\", a list with the address its ring sockets use "
                             "(Macs cabled with Thunderbolt: its end of the cable from the rank before it, which "
                             f"`./launch.sh hosts --over thunderbolt` proposes), e.g. {EXAMPLE}")
    return entries


def host_keys(entry: dict) -> dict:
    """An entry's planning keys (memory_gb, max_memory_gb, layers, ...)."""
    return {k: entry[k] for k in HOST_KEYS if k in entry}
