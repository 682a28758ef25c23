"""The docs site, built as scripts/test.sh builds it and read in a real headless Chromium."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from PIL import Image

from tests.support.browser import Browser

REPO = Path(__file__).resolve().parents[2]


def test_the_site_builds_and_its_getting_started_page_renders(tmp_path: Path):
    """`mkdocs build --strict` as scripts/test.sh runs it, then the getting-started page in a real
    headless Chromium: its heading and navigation are there, nothing was fetched from the network, and
    the screenshot shows the theme's header bar above a page of text (a broken theme or an empty page
    fails)."""
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    page_file = site / "getting-started.html"
    js = {
        "h1": "document.querySelector('article h1') && document.querySelector('article h1').textContent",
        "nav": "[...document.querySelectorAll('nav.md-nav--primary a.md-nav__link')].map(a => a.textContent.trim())",
        "text": "document.querySelector('article').innerText.length",
        "header": "getComputedStyle(document.querySelector('header.md-header')).backgroundColor",
        "header_box": "(() => { const r = document.querySelector('header.md-header').getBoundingClientRect();"
        " return [r.top, r.height] })()",
    }
    with Browser(width=1280, height=1000) as browser:
        page = browser.load(page_file, js)
    (tmp_path / "getting-started.png").write_bytes(page.screenshot)  # to look at when this fails
    assert page.errors == []
    assert page.values["h1"].startswith("Getting started"), page.values["h1"]
    assert {"Getting started", "Experiment keys", "Architecture and where a change goes"} <= set(page.values["nav"])
    assert page.values["text"] > 5000
    shot = Image.open(io.BytesIO(page.screenshot)).convert("RGB")
    # The theme's indigo header bar (mkdocs.yml: palette.primary) is drawn across the top of the page.
    header = tuple(int(v) for v in re.findall(r"\d+", page.values["header"]))
    assert len(header) == 3 and header[2] > header[0] + 80, f"the header is not indigo: {page.values['header']}"
    top, height = page.values["header_box"]
    band = shot.crop((0, int(top) + 2, shot.width, int(top + height) - 2))
    colors = {c: n for n, c in band.getcolors(maxcolors=band.width * band.height) or []}
    assert colors.get(header, 0) > 0.5 * band.width * band.height, "the theme's header bar is not drawn"
    body = shot.crop((0, int(top + height), shot.width, shot.height))
    dark = sum(n for n, c in body.getcolors(maxcolors=body.width * body.height) or [] if sum(c) < 200)
    assert dark > 5000, "the page below the header shows no text"
