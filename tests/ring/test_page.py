"""The web page at `/` in a real browser (Debian's Chromium, driven by Playwright) against a
real 2-rank server: it loads, shows every rank of the ring, streams a chat answer, and its
Stop button cancels a request on the server. `SCREENSHOTS_DIR` keeps the screenshots (the
README's come from it)."""

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from serverutil import running_server

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
        if all(
            r["open_sequences"] == 0
            for r in httpx.get(f"{server}/cluster/status", timeout=10).json()["ranks"]
        ):
            break
        page.wait_for_timeout(100)
    else:
        raise AssertionError("the stopped request still holds sequences")
    page.screenshot(path=str(shots(tmp_path) / "page-stopped.png"))
