"""`./launch.sh status`: is the ring up, and each rank's layers and memory
(rank 0's /cluster/status)."""

import json
import ssl
import urllib.request

from mlx_ring.launcher.ready import healthy


def fetch_status(url: str) -> dict:
    ctx = ssl.create_default_context()
    # our own rank 0, self-signed TLS_CERT too
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"{url}/cluster/status", timeout=10, context=ctx) as r:
        return json.load(r)


def table(s: dict) -> str:
    """The plan and one row per rank, as text."""
    rows = [("rank", "host", "layers", "weights", "resident", "KV cache", "sequences")]
    for r in s["ranks"]:
        ends = " + ends" if r["holds_embedding"] else ""
        rows.append(
            (
                str(r["rank"]),
                r["host"],
                "[%d, %d)%s" % (*r["layers"], ends),
                "%.1f MiB" % (r["parameter_bytes_kib"] / 1024),
                "%.1f MiB" % (r["rss_kib"] / 1024),
                "%.1f MiB" % (r["kv_cache_kib"] / 1024),
                str(r["open_sequences"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "model %(model)s, plan %(strategy)s over %(n_layers)d layers"
        % dict(s["plan"], model=s["model"])
        + (f", {s['plan']['mode']} mode" if s["plan"].get("mode") else "")
    ]
    if s["plan"].get("mode_reason"):
        lines.append(f"  mode {s['plan']['mode_reason']}")
    lines += ["  " + "  ".join(c.ljust(n) for c, n in zip(row, widths)).rstrip() for row in rows]
    lines.append(
        (
            "  %d request(s) queued, %d prompt(s) waiting to start (a prefill turn, or "
            "room in the KV cache)"
        )
        % (s["queued_requests"], s.get("waiting_prompts", 0))
    )
    return "\n".join(lines)


def status_text(url: str) -> str | None:
    """The table, or None when rank 0 does not answer."""
    if not healthy(url):
        return None
    try:
        return table(fetch_status(url))
    except OSError:
        return None
