"""The built site in a real browser: no code block overflows the page (headless Chromium).

tests/unit/test_docs_layout.py counts characters; this measures. The site is built as ``make docs``
builds it, the home page and Getting started are opened in headless Chromium at a laptop's width
(1366 px), and every ``pre > code`` of the content must show its longest line without scrolling
(``scrollWidth <= clientWidth``). A control block, one line of 200 characters put into the page,
must be found overflowing, so the measurement can fail. Screenshots of both pages are written
next to the built site (``KUBETUNE_DOCS_SCREENSHOTS`` names a folder to keep them in).

Chromium is Debian's ``chromium`` package; without it the test skips and says so.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.controlplane import REPO

WIDTH = 1366
PAGES = {"home": "index.html", "getting-started": "getting-started/index.html"}
CONTROL = "kubetune-control " + "x" * 200

MEASURE = """<script>
window.addEventListener('load', () => {
  const control = document.createElement('div');
  control.className = 'highlight';
  control.innerHTML = '<pre><code></code></pre>';
  control.querySelector('code').textContent = %s;
  document.querySelector('.md-content article').appendChild(control);
  const out = [];
  for (const code of document.querySelectorAll('.md-content pre > code')) {
    if (code.scrollWidth > code.clientWidth + 1) {
      const longest = code.textContent.split('\\n').reduce((a, l) => (l.length > a.length ? l : a), '');
      out.push({scrollWidth: code.scrollWidth, clientWidth: code.clientWidth, line: longest});
    }
  }
  control.remove();
  const result = document.createElement('pre');
  result.id = 'kubetune-overflow';
  result.textContent = JSON.stringify(out);
  document.body.appendChild(result);
});
</script>"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    return found


def run_chromium(browser: str, *args: str) -> str:
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},1400", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def browser() -> str:
    """Chromium, found (or the test skipped) before the site is built: no build for a skip."""
    return chromium()


@pytest.fixture(scope="module")
def site(browser: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, check=True, capture_output=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )  # fmt: skip
    return out


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_code_block_overflows_the_page_in_chromium(browser: str, site: Path, page: str) -> None:
    built = site / PAGES[page]
    measured = built.with_name("measured.html")
    measured.write_text(built.read_text().replace("</body>", MEASURE % json.dumps(CONTROL) + "</body>"))
    dom = run_chromium(browser, "--dump-dom", measured.as_uri())
    found = re.search(r'<pre id="kubetune-overflow">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    overflowing = json.loads(html.unescape(found[1]))
    # the control block overflows: the measurement sees an overflow where there is one
    assert [o["line"] for o in overflowing if o["line"] == CONTROL] == [CONTROL]
    assert [o for o in overflowing if o["line"] != CONTROL] == []

    shots = Path(os.environ.get("KUBETUNE_DOCS_SCREENSHOTS") or site)
    shots.mkdir(parents=True, exist_ok=True)
    run_chromium(browser, f"--screenshot={shots / f'{page}.png'}", built.as_uri())
    assert (shots / f"{page}.png").stat().st_size > 10_000
