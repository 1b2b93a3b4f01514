"""`dvc plots show` draws every plot in a real browser with the network off.

The page is DVC's own output through the project's template (plots/offline.html, set in
.dvc/config), opened by headless Chromium whose every host name fails to resolve. DVC's default
page, opened the same way, draws nothing: the control that shows the network really is off.
Chromium is Debian's package; .ci/run installs it and sets REPROGATE_REQUIRE_BROWSER=1, so on
CI a missing browser fails instead of skipping.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, copy_home, dvc_cmd

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9"]


@pytest.fixture
def browser() -> str:
    if BROWSER is None:
        if os.environ.get("REPROGATE_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed; .ci/run installs Debian's `chromium` package")
        pytest.skip("chromium is not installed (apt-get install chromium); .ci/run installs it")
    return BROWSER


def drawn(browser: str, page: Path) -> dict[str, bool]:
    """Each vega-embed plot of the page (by its div id) -> whether it drew a sized canvas."""
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", *OFFLINE, "--virtual-time-budget=20000"]
        + ["--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    ids = re.findall(r"vegaEmbed\('#([^']+)'", Path(page).read_text(encoding="utf-8"))
    out = {}
    for i in ids:
        after = dom.split(f'<div id="{i}"', 1)[1][:600]
        out[i] = bool(re.search(r'<canvas width="[1-9]\d*" height="[1-9]\d*"', after))
    return out


def declared_plots(root: Path) -> set[str]:
    """The plot files dvc.yaml declares, as DVC names their divs (path with / and . as _)."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    found = set()
    for stage in stages.values():
        keys = list(stage.get("foreach", {None: None}))
        for plot in stage.get("do", stage).get("plots", []):
            path = next(iter(plot)) if isinstance(plot, dict) else plot
            for key in keys:
                found.add(re.sub(r"[/.]", "_", path.replace("${key}", key or "")))  # noqa: RUF027
    return found


def test_every_plot_draws_offline_from_the_repository_template(home_pipeline, tmp_path, browser):
    root = copy_home(home_pipeline, tmp_path / "home")
    dvc_cmd(root, "plots", "show", "-o", str(tmp_path / "page"))
    page = tmp_path / "page" / "index.html"
    assert "cdn.jsdelivr" not in page.read_text(encoding="utf-8")
    result = drawn(browser, page)
    assert set(result) == declared_plots(root), "every declared plot is on the page"
    assert all(result.values()), [i for i, ok in result.items() if not ok]
    assert "plots_tiny_per_intent_json" in result  # the per-intent table is a plot now


def test_dvc_default_page_draws_nothing_without_the_network(home_pipeline, tmp_path, browser):
    from dvc_render.html import PAGE_HTML

    root = copy_home(home_pipeline, tmp_path / "home")
    (tmp_path / "default.html").write_text(PAGE_HTML)
    page = tmp_path / "page"
    dvc_cmd(root, "plots", "show", "-o", str(page), "--html-template", str(tmp_path / "default.html"))
    result = drawn(browser, page / "index.html")
    assert result and not any(result.values())


def test_the_committed_template_is_the_pinned_libraries():
    # tools/offline_plots.py builds it from npm tarballs checked against pinned sha512s; the
    # page must say which, and keep DVC's placeholder once.
    page = (REPO / "plots" / "offline.html").read_text(encoding="utf-8")
    assert page.count("{plot_divs}") == 1 and "{scripts}" not in page
    for pin in ("vega@5.20.2", "vega-lite@5.2.0", "vega-embed@6.18.2"):
        assert f"<script>/* {pin} */" in page
    assert "html_template = ../plots/offline.html" in (REPO / ".dvc" / "config").read_text()
