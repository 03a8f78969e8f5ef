"""The web page at `/` in a real browser (Debian's Chromium, driven by Playwright) against a
real 2-rank server: it loads, shows every rank of the ring, streams a chat answer, and its
Stop button cancels a request on the server; against the app around the stand-in engine, it
shows the prompts prefilling now. `SCREENSHOTS_DIR` keeps the screenshots (the README's come
from it)."""

import os
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import uvicorn
from apiutil import FakeEngine, served_model
from mlx_lm.utils import load_tokenizer
from serverutil import running_server

from mlx_ring.api.app import make_app
from mlx_ring.ring.launch import free_port
from mlx_ring.serving.port import PrefillProgress, PromptCacheStats

CHROMIUM = "/usr/bin/chromium"
# As the machine's notes say: no background traffic (this network is closed), no sandbox as root.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str | None:
    """Debian's Chromium, installed with apt when missing (root); None if it cannot be had."""
    if not shutil.which("chromium") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            (
                "apt-get install -y -qq chromium || (apt-get update -qq && apt-get "
                "install -y -qq chromium)"
            ),
            shell=True,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    return CHROMIUM if Path(CHROMIUM).exists() else None


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    if path is None:
        pytest.skip(
            (
                "the page test needs Debian's chromium (apt-get install chromium), which "
                "could not be installed"
            )
        )
    from playwright.sync_api import sync_playwright

    # launch.sh preloads OpenBLAS for MLX; preloaded into Playwright's driver and Chromium it breaks
    # both (pthread_create fails). They start without it; the server keeps it.
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        p = sync_playwright().start()
        b = p.chromium.launch(executable_path=path, args=FLAGS)
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
    yield b
    b.close()
    p.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, default_model):
    with running_server(tmp_path_factory.mktemp("page"), n_ranks=2) as (url, _):
        yield url


def shots(tmp_path) -> Path:
    return Path(os.environ.get("SCREENSHOTS_DIR") or tmp_path)


def test_page_shows_the_ring_and_streams_a_chat(browser, server, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(server + "/")
    page.wait_for_selector(".rank[data-rank='1']", timeout=30_000)
    ranks = page.locator(".rank")
    assert ranks.count() == 2
    assert (
        "layers [0, 15)" in ranks.nth(0).inner_text()
        and "layers [15, 30)" in ranks.nth(1).inner_text()
    )
    assert "healthy" in page.locator("#health").inner_text()
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "24")
    page.fill("#prompt", "What is the capital of France?")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "document.querySelectorAll('.msg.assistant').length == 1 && "
        "!document.getElementById('send').disabled && document.querySelector('.msg.assistant "
        "span').textContent.length > 0",
        timeout=60_000,
    )
    assert "Paris" in page.locator(".msg.assistant span").inner_text()
    page.wait_for_timeout(2500)  # one more refresh: busy % and tokens/s from two scrapes
    assert (
        "busy" in ranks.nth(1).inner_text() and "tokens/s" in page.locator("#totals").inner_text()
    )
    page.screenshot(path=str(shots(tmp_path) / "page.png"))


def test_stop_button_cancels_the_request_on_the_server(browser, server, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(server + "/")
    page.fill("#max_tokens", "400")
    page.fill("#prompt", "Write a very long story about the sea, with many chapters.")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "document.querySelector('.msg.assistant span') && document.querySelector('.msg.assistant "
        "span').textContent.length > 20",
        timeout=60_000,
    )
    page.click("#stop")
    page.wait_for_function(
        "document.querySelector('.msg.assistant span').textContent.endsWith('[stopped]')",
        timeout=10_000,
    )
    for _ in range(100):  # the server let the sequence go on every rank
        status = httpx.get(f"{server}/cluster/status", timeout=10)
        assert status.status_code == 200, status.text
        if all(r["open_sequences"] == 0 for r in status.json()["ranks"]):
            break
        page.wait_for_timeout(100)
    else:
        raise AssertionError("the stopped request still holds sequences")
    page.screenshot(path=str(shots(tmp_path) / "page-stopped.png"))


@pytest.fixture(scope="module")
def stand_in(default_model):
    """The app around the stand-in engine (tests/apiutil.py) over real HTTP: the page shows what
    the engine's figures say, whatever a real ring's timing."""
    served = served_model(default_model, load_tokenizer(default_model))
    engine = FakeEngine(served.tokenizer)
    port = free_port()
    web = uvicorn.Server(
        uvicorn.Config(make_app(engine, served), host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not web.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", engine
    web.should_exit = True
    thread.join(30)


def test_page_shows_each_prompt_prefilling_now(browser, stand_in):
    url, engine = stand_in
    engine.snapshot = replace(
        engine.snapshot,
        prefills=(PrefillProgress(120_000, 45_056, 40_000), PrefillProgress(900, 512, 0)),
    )
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(url + "/")
    page.wait_for_selector(".prefill", timeout=30_000)
    shown = page.locator(".prefill")
    assert shown.count() == 2
    assert shown.nth(0).inner_text() == (
        "prefilling a prompt: 45,056 of 120,000 tokens (40,000 from the prompt cache)"
    )
    assert shown.nth(1).inner_text() == "prefilling a prompt: 512 of 900 tokens"
    bars = page.locator(".prefill .bar > div")
    assert [bars.nth(i).evaluate("e => e.style.width") for i in range(2)] == ["37.5%", "56.9%"]
    engine.snapshot = replace(engine.snapshot, prefills=())  # both done: the next refresh
    page.wait_for_function("!document.querySelector('.prefill')", timeout=10_000)


def test_page_shows_the_prompt_caches_tiers_and_what_they_saved(browser, stand_in):
    url, engine = stand_in
    disk = {"blocks": 22, "bytes": 1, "cap_bytes": 2, "written_bytes": 1, "writing": True}
    engine.snapshot = replace(
        engine.snapshot,
        prompt_cache=PromptCacheStats(24, 5_772, 46_603, 2, 11_364, 256, 5_632, disk),
    )
    page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(url + "/")
    page.wait_for_function("document.getElementById('cache').textContent", timeout=30_000)
    assert page.locator("#cache").inner_text() == (
        "prompt cache: RAM 5,772 of 46,603 tokens · disk 5,632 tokens · 2 prompts reused "
        "11,364 tokens (5,632 from disk)"
    )
