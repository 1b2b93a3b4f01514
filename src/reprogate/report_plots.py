"""The report's PNG plots: Vega-Lite specs built from report.json, drawn by vl-convert (Vega
compiled into the wheel: no browser, no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def draw(report: dict[str, Any], out: Path) -> dict[str, str]:
    """Write each plot to out/<name>.png; file name -> title."""
    import vl_convert

    drawn = {}
    for name, (title, spec) in specs(report).items():
        (out / name).write_bytes(vl_convert.vegalite_to_png(spec, scale=2))
        drawn[name] = title
    return drawn
