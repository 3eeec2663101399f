"""The tree viewer and the documentation site in a real browser (headless Chromium).

``treeroll show``'s HTML page is a self-contained interactive picture: its script draws nothing
itself (the SVG is written by Python) but wires every node to the side panel, so a broken
script would ship unnoticed without a browser. Chromium comes from Debian's packages (``.ci/run``
installs it where it is missing); Playwright drives it. Skipped, saying why, only where no
Chromium can be found. Screenshots are kept in ``test-artifacts/browser/`` (ignored by git).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from treeroll.tree_json import load_tree

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = os.environ.get("TREEROLL_CHROMIUM") or shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium here (apt-get install chromium, or set TREEROLL_CHROMIUM)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=_chromium(), headless=True,
                                          args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A page at ``url`` and the list its console errors and uncaught exceptions go to."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_load_state("networkidle")
    return page, errors


def _run(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "treeroll.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_tree_viewer_draws_every_node_and_shows_a_clicked_turn(browser: Any,
                                                                   tmp_path: Path) -> None:
    tree_file = tmp_path / "patr.json"
    _run("rollout", "--strategy", "patr", "--out", str(tree_file), cwd=ROOT)
    _run("show", str(tree_file), "--formats", "html", cwd=ROOT)
    tree = load_tree(tree_file)
    page, errors = _open(browser, tree_file.with_suffix(".html").as_uri())
    assert page.locator("circle[data-node-id]").count() == len(tree.nodes)
    turn = max(tree.nodes[1:], key=lambda node: len(node.action_text))  # a turn with text
    page.locator(f'circle[data-node-id="{turn.id}"]').click()
    assert page.text_content("#f-action_text") == turn.action_text
    assert page.text_content("#f-observation_text") == turn.observation_text
    assert page.text_content("#f-id") == str(turn.id)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "tree_viewer.png"), full_page=True)
    assert not errors, errors


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The documentation site, built and served over HTTP (as ``mkdocs serve`` would)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # no request lines in the test output
            pass

    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_the_sites_home_page_renders_with_its_picture_and_navigation(browser: Any,
                                                                      site: str) -> None:
    page, errors = _open(browser, site + "/")
    assert "treeroll" in page.title()
    picture = page.locator("img[src*='tree_patr.png']")
    assert picture.count() == 1
    assert picture.evaluate("img => img.complete && img.naturalWidth > 0")
    assert page.locator("nav").first.is_visible()
    page.get_by_role("link", name="Getting started").first.click()
    page.wait_for_load_state("networkidle")
    assert "frozenlake-tiny" in page.content()  # the quick tour, included from the README
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "site_getting_started.png"), full_page=False)
    assert not errors, errors
