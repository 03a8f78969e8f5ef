"""schemathesis against the server's own /openapi.json: no 5xx, responses as documented. The app is
served over real HTTP (uvicorn, as server.py serves it) in this process around the stand-in engine:
which requests the API takes, refuses and how it answers is the app's; the real engine's answers to
generated requests are covered on a ring by tests/ring/test_adversarial.py."""

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import uvicorn
from apiutil import FakeEngine

from mlx_ring.api.app import make_app
from mlx_ring.ring.launch import free_port


def fuzzable(doc: dict) -> dict:
    """The served document less the JSON schemas an answer may be asked to match (chat's and the
    Responses API's `json_schema` formats, Anthropic's `output_config.format`, Ollama's
    `format`): which JSON schemas llguidance can enforce (not unsatisfiable, no unsupported
    keyword) is a set no OpenAPI schema states, and the server refuses the others with a 400
    naming why (tests/ring/test_chat_features.py)."""
    schemas = doc["components"]["schemas"]
    for union in (
        next(b for b in schemas[name]["properties"][prop]["anyOf"] if "oneOf" in b)
        for name, prop in (("ChatCompletionRequest", "response_format"), ("TextConfig", "format"))
    ):
        union["oneOf"] = [r for r in union["oneOf"] if not r["$ref"].endswith("JsonSchemaFormat")]
        union["discriminator"]["mapping"].pop("json_schema")
    # Anthropic's and Ollama's take only a schema (an empty one too): no value of them is generated
    for name in ("OutputConfig", "ChatRequest", "GenerateRequest"):
        schemas[name]["properties"].pop("format")
    return doc


def test_api_conforms_and_never_fails(tmp_path, served):
    # The limits server.py gets from --max-tokens 2 --max-tokens-limit 4: short answers, and a bound
    # to refuse past.
    app = make_app(
        FakeEngine(served.tokenizer), replace(served, default_max_tokens=2, max_tokens_limit=4)
    )
    port = free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
    web = threading.Thread(target=http.run, daemon=True)
    web.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not http.started:
            assert web.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        doc = tmp_path / "openapi.json"
        doc.write_text(json.dumps(fuzzable(httpx.get(f"{url}/openapi.json", timeout=30).json())))
        st = Path(sys.executable).parent / "schemathesis"
        proc = subprocess.run(
            [
                str(st),
                "run",
                str(doc),
                "--url",
                url,
                "--checks",
                "all",
                "--max-response-time",
                "300",
                "--max-examples",
                "25",
                "--request-timeout",
                "120",
                "--generation-deterministic",
                "--suppress-health-check",
                "all",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        http.should_exit = True
        web.join(30)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
