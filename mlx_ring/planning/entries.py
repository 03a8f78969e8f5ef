"""hosts.json's entries as read from disk: one JSON object per rank, in ring order, checked for shape.

Planning reads the planning keys from them; hosts/ resolves their addresses (hosts/hostfile.py).
"""

from pathlib import Path

from mlx_ring.config import json_objects
from mlx_ring.planning.capabilities import HOST_KEYS

KNOWN_KEYS = ("ssh", "ips", "rdma", *HOST_KEYS)
EXAMPLE = '[{"ssh": "mac-a.local", "ips": ["192.168.1.10"]}, {"ssh": "mac-b.local", "ips": ["192.168.1.11"]}]'


def load_entries(path: Path) -> list[dict]:
    """The hostfile's entries (one per rank, ring order), checked for shape."""
    entries = json_objects(path, "the hostfile", EXAMPLE, KNOWN_KEYS)
    for i, e in enumerate(entries):
        where = f"{path}: entry {i}"
        if not isinstance(e.get("ssh"), str) or not e["ssh"].strip():
            raise ValueError(f"{where} lacks \"ssh\", the name to ssh into (\"127.0.0.1\" for this machine), e.g. {EXAMPLE}")
        ips = e.get("ips")
        if not isinstance(ips, list) or not ips or not all(isinstance(a, str) and a.strip() for a in ips):
            raise ValueError(f"{where} ({e['ssh']}) lacks \"ips\", a list with the address its ring sockets use "
                             f"(on Macs, the Thunderbolt bridge address), e.g. {EXAMPLE}")
    return entries


def host_keys(entry: dict) -> dict:
    """An entry's planning keys (memory_gb, max_memory_gb, layers, ...)."""
    return {k: entry[k] for k in HOST_KEYS if k in entry}
