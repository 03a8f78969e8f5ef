"""How many decode groups a ring starts with when GROUPS is auto: one per device
its ranks compute on."""

import ipaddress
import json
from dataclasses import replace
from pathlib import Path

from mlx_ring.planning.capabilities import Capabilities, colocate
from mlx_ring.planning.probe import local_capabilities
from mlx_ring.serving.warmup import decode_groups

ROOT = Path(__file__).resolve().parents[3]
BOX = Capabilities("box", 16, 8, 0.1, 20)


def test_the_shipped_hosts_json_decodes_in_one_group(tmp_path, monkeypatch):
    """The shipped hosts.json starts every rank on this machine; each rank probes itself as a
    rank does at startup (its host and the cores it may use), so the ranks share the
    machine's cores and one group is the faster choice (4 streams: 3.0x one stream in one
    group, 2.0-2.2x in two)."""
    entries = json.loads((ROOT / "hosts.json").read_text())
    assert len(entries) > 1 and all(ipaddress.ip_address(e["ssh"]).is_loopback for e in entries), (
        entries
    )
    # the speed is not what decides; not measured here
    speed = {"memory_gb": 16, "tflops": 0.1, "bandwidth_gbs": 20}
    monkeypatch.setenv("MLX_RING_CAPS", json.dumps([speed] * len(entries)))
    caps = colocate([local_capabilities(tmp_path, "float32", r) for r in range(len(entries))])
    groups, why = decode_groups(0, caps, batches=True)
    assert groups == 1, why
    assert "take turns" in why


def test_ranks_with_devices_of_their_own_keep_one_group_each():
    pinned = [replace(BOX, unit="cores 0"), replace(BOX, unit="cores 1")]
    assert decode_groups(0, pinned, batches=True)[0] == 2
    macs = [replace(BOX, host="mac-a"), replace(BOX, host="mac-b"), replace(BOX, host="mac-c")]
    assert decode_groups(0, macs, batches=True)[0] == 3
    # Two ranks share a machine, a third has its own: two devices, two groups.
    assert decode_groups(0, [BOX, BOX, replace(BOX, host="other")], batches=True)[0] == 2
    assert decode_groups(0, [BOX], batches=True)[0] == 1


def test_groups_set_or_a_model_that_does_not_batch_keep_theirs():
    assert decode_groups(3, [BOX, BOX], batches=True) == (3, "GROUPS")
    # A model that decodes one request per group serves as many requests at once as it has groups.
    assert decode_groups(0, [BOX, BOX], batches=False)[0] == 2
