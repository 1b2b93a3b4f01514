"""Build plots/offline.html: the page `dvc plots show` fills, with vega, vega-lite and
vega-embed inside it, so the plots draw without a network.

DVC's own page loads the three libraries from a CDN (blank offline). Its renderer puts those
<script src=...> tags where a template says `{scripts}`; this template has no such placeholder,
and carries the libraries' minified builds, from their npm packages, at the versions DVC's
renderer targets. Each tarball is checked against the registry's sha512 integrity pinned below
before anything is read from it. The page is committed; run this again only to change a pin:

    python tools/offline_plots.py          # writes plots/offline.html
    python tools/offline_plots.py --check  # fails when the committed page differs from the pins
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "plots" / "offline.html"
# name: (version, npm dist.integrity, file in the package); the versions dvc-render's page loads.
PINS = {
    "vega": (
        "5.20.2",
        "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5jQ80EVw==",
        "package/build/vega.min.js",
    ),
    "vega-lite": (
        "5.2.0",
        "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
        "package/build/vega-lite.min.js",
    ),
    "vega-embed": (
        "6.18.2",
        "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
        "package/build/vega-embed.min.js",
    ),
}
HEAD = """<!DOCTYPE html>
<html>
<head>
{refresh_tag}
<meta charset="utf-8">
<title>reprogate plots</title>
<!-- Built by tools/offline_plots.py: {versions}, BSD-3-Clause, from registry.npmjs.org. -->
<style>body { font-family: sans-serif; } table { border-spacing: 15px; }</style>
"""
TAIL = """</head>
<body>
{plot_divs}
</body>
</html>
"""


def fetch(name: str, version: str, integrity: str, member: str) -> str:
    url = f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz"
    with urllib.request.urlopen(url, timeout=60) as r:
        tarball = r.read()
    got = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if got != integrity:
        sys.exit(f"{url}: integrity {got}, pinned {integrity}: not used")
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        f = tar.extractfile(member)
        if f is None:
            sys.exit(f"{url} has no {member}")
        return f.read().decode("utf-8")


def page() -> str:
    versions = ", ".join(f"{n}@{v}" for n, (v, _, _) in PINS.items())
    # DVC fills the page with str.replace on {refresh_tag} and {plot_divs}: no other brace is
    # special to it.
    head = HEAD.replace("{versions}", versions)
    scripts = []
    for name, (version, integrity, member) in PINS.items():
        code = fetch(name, version, integrity, member).replace("</script", "<\\/script")
        for placeholder in ("{plot_divs}", "{refresh_tag}", "{scripts}"):  # noqa: RUF027
            if placeholder in code:
                sys.exit(f"{name}@{version} contains {placeholder}, which DVC would replace")
        scripts.append(f"<script>/* {name}@{version} */\n{code}\n</script>\n")
    return head + "".join(scripts) + TAIL


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    built = page()
    if ap.parse_args().check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != built:
            sys.exit(f"{PAGE} differs from the pinned libraries: run python tools/offline_plots.py")
        print(f"{PAGE} matches the pins")
        return
    PAGE.write_text(built, encoding="utf-8")
    print(f"wrote {PAGE} ({PAGE.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
