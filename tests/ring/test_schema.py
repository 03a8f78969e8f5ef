"""schemathesis against the server's own /openapi.json: no 5xx, responses as documented."""

import json
import subprocess
import sys
from pathlib import Path

import httpx
from serverutil import running_server


def fuzzable(doc: dict) -> dict:
    """The served document less `response_format`'s json_schema variant: which JSON schemas
    llguidance can enforce (not unsatisfiable, no unsupported keyword) is a set no OpenAPI schema
    states, and the server refuses the others with a 400 naming why (tests/ring/test_chat_features.py)."""
    prop = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["response_format"]
    union = next(b for b in prop["anyOf"] if "oneOf" in b)
    union["oneOf"] = [r for r in union["oneOf"] if not r["$ref"].endswith("/JsonSchemaFormat")]
    union["discriminator"]["mapping"].pop("json_schema")
    return doc


def test_api_conforms_and_never_fails(tmp_path, default_model):
    # Completions of at most 4 tokens keep each generated request cheap on a CPU.
    with running_server(tmp_path, n_ranks=2, extra_args=["--max-tokens", "2", "--max-tokens-limit", "4"]) as (url, _):
        doc = tmp_path / "openapi.json"
        doc.write_text(json.dumps(fuzzable(httpx.get(f"{url}/openapi.json", timeout=30).json())))
        st = Path(sys.executable).parent / "schemathesis"
        proc = subprocess.run(
            [str(st), "run", str(doc), "--url", url, "--checks", "all",
             # Speed is the benchmark's business; on a shared 2-core CPU a 16-token answer can pass 10 s.
             "--max-response-time", "300", "--max-examples", "25",
             "--request-timeout", "120", "--generation-deterministic", "--suppress-health-check", "all"],
            capture_output=True, text=True, timeout=900,
        )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
