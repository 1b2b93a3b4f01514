"""The report's PNG plots, drawn by vl-convert (Vega compiled into the wheel: no browser, no
network): two built from report.json (held-out accuracy per candidate, the intents that moved
most), and DVC's own plots of the chosen candidate as `dvc plots diff` overlays base and head
(the same Vega-Lite specs the offline HTML page draws)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reprogate.utils import dvc_cli

SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


def _grouped(values: list[dict], x: str, title: str, y_title: str, zero: bool = True) -> dict[str, Any]:
    """Bars of base and head side by side for each x (`zero`: the axis starts at 0, else just
    below the lowest bar: a bar's axis starts at 0 unless given a domain)."""
    low = min(v["value"] for v in values)
    scale = {"domain": [max(0.0, round(low - 0.05, 2)), 1.0]} if not zero else {}
    return {
        "$schema": SCHEMA,
        "title": title,
        "data": {"values": values},
        "mark": {"type": "bar", "clip": True},
        "width": {"step": 28},
        "height": 220,
        "encoding": {
            "x": {"field": x, "type": "nominal", "sort": None, "axis": {"labelAngle": -40}},
            "xOffset": {"field": "revision", "sort": ["base", "head"]},
            "y": {"field": "value", "type": "quantitative", "title": y_title, "scale": scale},
            "color": {"field": "revision", "sort": ["base", "head"]},
        },
    }


def specs(report: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """file name -> (title, Vega-Lite spec) for each plot this report has data for."""
    out = {}
    acc = [
        {"candidate": r["model"], "revision": side, "value": r[side]}
        for r in report["metrics"]
        if r["set"] == "test" and r["metric"] == "accuracy"
        for side in ("base", "head")
        if r[side] is not None
    ]
    if acc:
        title = "Held-out test accuracy, base vs head"
        # Accuracies differ in the second decimal: an axis from 0 would hide every change.
        out["accuracy.png"] = (title, _grouped(acc, "candidate", title, "accuracy", zero=False))
    moved = report["intents"]["moved"]
    if moved:
        values = [
            {"intent": r["intent"], "revision": s, "value": r[s]} for r in moved for s in ("base", "head")
        ]
        title = f"Intents that moved most ({report['intents']['model']}), test F1"
        out["intents.png"] = (title, _grouped(values, "intent", title, "F1"))
    return out


def dvc_plots(root: Path, base: str, head: str | None, model: str | None) -> tuple[dict, str | None]:
    """file name -> (title, spec) of DVC's plots of `model`, base and head in each, and why they
    are missing when `dvc plots diff` fails."""
    if model is None:
        return {}, None
    proc = dvc_cli.call(root, "plots", "diff", "--json", base, *([head] if head else []))
    if proc.returncode != 0:
        return {}, f"DVC's plots (`dvc plots diff` failed: {dvc_cli.last_error(proc)})"
    out = {}
    for path, parts in json.loads(proc.stdout or "{}").get("data", {}).items():
        if path.startswith(f"plots/{model}/") and parts and parts[0].get("type") == "vega":
            out[f"{model}-{Path(path).stem}.png"] = (f"{path}, base and head", parts[0]["content"])
    return out, None


def draw(plots: dict[str, tuple[str, dict[str, Any]]], out: Path) -> dict[str, str]:
    """Write each plot to out/<name>.png; file name -> title."""
    import vl_convert

    drawn = {}
    for name, (title, spec) in plots.items():
        (out / name).write_bytes(vl_convert.vegalite_to_png(spec, scale=2))
        drawn[name] = title
    return drawn
