"""schemathesis against the server's own /openapi.json: no 5xx, responses as documented."""

import subprocess
import sys
from pathlib import Path

from serverutil import running_server


def test_api_conforms_and_never_fails(tmp_path, default_model):
    # Completions of at most 4 tokens keep each generated request cheap on a CPU.
    with running_server(tmp_path, n_ranks=2, extra_args=["--max-tokens", "2", "--max-tokens-limit", "4"]) as (url, _):
        st = Path(sys.executable).parent / "schemathesis"
        proc = subprocess.run(
            [str(st), "run", f"{url}/openapi.json", "--checks", "all",
             # Speed is the benchmark's business; on a shared 2-core CPU a 16-token answer can pass 10 s.
             "--max-response-time", "300", "--max-examples", "25",
             "--request-timeout", "120", "--generation-deterministic", "--suppress-health-check", "all"],
            capture_output=True, text=True, timeout=900,
        )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
