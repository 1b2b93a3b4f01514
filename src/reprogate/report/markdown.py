"""report.json -> report.md: tables a reviewer reads in the pull request, every number taken
from the report (never typed here)."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import quote

MARKER = "<!-- reprogate-report -->"  # CI finds and updates its one comment by this line


def escape(text: Any) -> str:
    """Text read from records, inert in a Markdown table cell: one line, no HTML, no markup."""
    flat = html.escape(" ".join(str(text).split()), quote=False)
    # [ and ] escaped, no link or image can open; a parenthesis alone is plain text.
    return re.sub(r"([\\`*_{}\[\]#|~])", r"\\\1", flat)


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _signed(v: float | None) -> str:
    return "—" if v is None else f"{v:+.4f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Every cell comes from the records (labels, model names, notes): escaped, so none of it
    can end a row, open HTML or a link, or start a heading of its own."""
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(escape(c) for c in r) + " |" for r in rows),
    ]


def _split(head: list[str], changed: list[list[str]], same: list[list[str]], what: str) -> list[str]:
    """Changed rows in a table; the unchanged ones folded away (GitHub renders <details>)."""
    lines = _table(head, changed) if changed else [f"No {what} changed."]
    if same:
        lines += ["", f"<details><summary>{len(same)} unchanged {what}</summary>", ""]
        lines += [*_table(head, same), "", "</details>"]
    return lines


def _gate(g: dict[str, Any], pipeline: str) -> list[str]:
    def side(s: dict | None) -> str:
        if not s:
            return "no gate record"
        return f"**{escape(s['chosen'])}** chosen" if s["passed"] else "no candidate passed"

    title = (
        "## Gate"
        if pipeline == "default"
        else f"## Gate of the {pipeline} (all candidates of both pipelines)"
    )
    lines = [title, "", f"- head: {side(g['head'])}", f"- base: {side(g['base'])}", ""]
    changed, same = [], []
    for r in g["rules"]:
        b, h = r.get("base") or {}, r.get("head") or {}
        row = [
            r["candidate"],
            r["rule"],
            f"{_num(b.get('value'))} → {_num(h.get('value'))}",
            f"{h.get('op') or b.get('op') or ''} {_num(h.get('threshold', b.get('threshold')))}",
            f"{b.get('verdict', '—')} → {h.get('verdict', '—')}",
        ]
        (changed if r["changed"] else same).append(row)
    head = ["candidate", "rule", "value (base → head)", "threshold", "verdict (base → head)"]
    return lines + _split(head, changed, same, "verdicts")


def _metrics(rows: list[dict], paired: dict[str, Any]) -> list[str]:
    changed, same = [], []
    for r in rows:
        ci = ""
        p = paired.get(r["model"], {})
        if r["set"] == "test" and p.get("paired") and r["metric"] in p["delta_ci95"]:
            lo, hi = p["delta_ci95"][r["metric"]]
            ci = f"[{lo:+.4f}, {hi:+.4f}]"
        better = {True: "better", False: "worse", None: "same" if r["delta"] == 0 else "—"}[r["better"]]
        row = [r["model"], r["set"], r["metric"], _num(r["base"]), _num(r["head"]), _signed(r["delta"])]
        (same if r["delta"] == 0 else changed).append([*row, better, ci])
    head = ["candidate", "set", "metric", "base", "head", "Δ", "direction", "paired 95% CI of Δ"]
    return ["## Headline metrics", "", *_split(head, changed, same, "metrics")]


def _paired(paired: dict[str, Any]) -> list[str]:
    rows = []
    for name, p in paired.items():
        if not p["paired"]:
            rows.append([name, f"not paired: {p['why']}", "", "", "", "", ""])
            continue
        rows.append(
            [name, str(p["items"]), str(p["fixed"]), str(p["broken"]), str(p["both_right"])]
            + [str(p["both_wrong"]), f"{p['p_value']:.4g}"]
        )
    head = ["candidate", "items", "fixed", "broken", "both right", "both wrong", "McNemar p"]
    intro = (
        "Held-out items both revisions predicted (same id, text and gold label): fixed = base wrong, "
        "head right."
    )
    return ["## Paired predictions", "", intro, "", *_table(head, rows)]


def _intents(i: dict[str, Any]) -> list[str]:
    if not i["moved"]:
        return ["## Intents that moved most", "", f"No intent's test F1 changed ({escape(i['model'])})."]
    rows = [[r["intent"], _num(r["base"]), _num(r["head"]), _signed(r["delta"])] for r in i["moved"]]
    return [
        f"## Intents that moved most ({escape(i['model'])}, test F1)",
        "",
        *_table(["intent", "base", "head", "Δ"], rows),
    ]


def _stages(s: dict[str, list[str]]) -> list[str]:
    lines = ["## Stages (from dvc.lock)", ""]
    for kind in ("reran", "added", "removed", "unchanged"):
        if s[kind]:
            lines.append(f"- {kind} ({len(s[kind])}): " + ", ".join(escape(x) for x in s[kind]))
    return lines


def _resume(rows: list[dict]) -> list[str]:
    def side(r: dict | None) -> str:
        if not r:
            return "—"
        failed = f", failed: {', '.join(r['failed'])}" if r["failed"] else ""
        return f"{'passed' if r['passed'] else 'FAILED'} (restored step {r['restored_step']}{failed})"

    table = _table(["model", "base", "head"], [[r["model"], side(r["base"]), side(r["head"])] for r in rows])
    return ["## Resume checks", "", *table]


def _environment(e: dict[str, Any]) -> list[str]:
    keys = sorted(set(e["base"]["environment"]) | set(e["head"]["environment"]))
    rows = [
        [k, str(e["base"]["environment"].get(k, "—")), str(e["head"]["environment"].get(k, "—"))]
        for k in keys
    ]
    for k in ("code_hash", "requirements_lock_sha256"):
        rows.append([k, (e["base"][k] or "—")[:12], (e["head"][k] or "—")[:12]])
    return ["## Environment", "", *_table(["", "base", "head"], rows)]


def _reproduced(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return []
    c = r["counts"]
    missing = c.get("missing", 0)
    worst = "within tolerance" if c["within tolerance"] else "bitwise"
    worst = "different" if c["different"] or missing else worst
    lines = [
        "## Did the base reproduce?",
        "",
        f"Rebuilt here from nothing: **{worst}** ({c['bitwise']} bitwise, {c['within tolerance']} within "
        f"tolerance {r['tolerance']:g}, {c['different']} different, {missing} missing; `reprogate verify`).",
    ]
    rows = [[x["path"], x["verdict"], x["detail"]] for x in r["not_bitwise"]]
    return lines + (["", *_table(["output", "verdict", "detail"], rows)] if rows else [])


def render(r: dict[str, Any], images: dict[str, str]) -> str:
    head, base = escape(r["head"]["label"]), escape(r["base"]["label"])
    lines = [MARKER, f"# reprogate report: {head} vs base {base}", ""]
    sections = [
        _gate(r["gate"], r.get("pipeline", "default")),
        _metrics(r["metrics"], r["paired"]),
        _paired(r["paired"]),
        _intents(r["intents"]),
        _stages(r["stages"]),
        _resume(r["resume"]),
        _environment(r["environment"]),
        _reproduced(r.get("reproduced")),
    ]
    for s in filter(None, sections):
        lines += [*s, ""]
    if images:
        plots = [f"![{escape(title)}]({quote(name)})" for name, title in images.items()]
        lines += ["## Plots", "", *plots, ""]
    if r["missing"]:
        lines += ["## Not available", ""] + [f"- {escape(m)}" for m in r["missing"]] + [""]
    lines.append("Every number above is read from the two revisions' files by `reprogate report`.")
    return "\n".join(lines) + "\n"
