"""hosts.json written into a test's folder and loaded as the launcher loads it, names resolved by
a stand-in for the network's DNS unless a test gives its own."""

import json

from mlx_ring.hostfile import load_hosts


def hosts_from(tmp_path, entries, resolver=lambda n: {"mac-b.local": "192.168.1.11"}.get(n, n)):
    path = tmp_path / "hosts.json"
    path.write_text(entries if isinstance(entries, str) else json.dumps(entries))
    return load_hosts(path, 5000, resolver)
