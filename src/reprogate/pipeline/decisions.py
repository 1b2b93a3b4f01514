"""Did the decisions hold where the bits did not? `reprogate verify`'s second verdict.

Bits can move without any decision moving (another GPU, ONNX Runtime on another instruction set,
a vendor's GEMM). What a reviewer needs then: every prediction's intent and route, every gate
rule's verdict per candidate, and the chosen candidate, each compared between the commit and the
rebuild. The gate's record is in git; the commit's predictions are DVC outputs, read from this
project's DVC cache (or its remote) when they are there, and said to be unchecked when not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from reprogate.records.base import parse
from reprogate.records.evaluation import PredictionLine
from reprogate.records.gate import Decision
from reprogate.utils.errors import first_problem


@dataclass
class Held:
    """One kind of decision: how many were compared, which changed, or why none were."""

    what: str
    compared: int = 0
    changed: list[str] = field(default_factory=list)
    unchecked: str | None = None

    def line(self) -> str:
        if self.unchecked:
            return f"decisions: {self.what} not checked: {self.unchecked}"
        if not self.compared:  # nothing on either side: nothing held
            return f"decisions: {self.what} not checked: there was nothing to compare"
        if not self.changed:
            return f"decisions: {self.what} held ({self.compared} equal)"
        more = len(self.changed) - 5
        shown = "; ".join(self.changed[:5]) + (f"; and {more} more" if more > 0 else "")
        return f"decisions: {self.what} CHANGED, {len(self.changed)} of {self.compared}: {shown}"


def _verdicts(raw: bytes | str) -> dict[str, str]:
    d = Decision.model_validate_json(raw)
    out = {"chosen": str(d.chosen), "passed": str(d.passed)}
    for name, c in d.candidates.items():
        out[f"{name}: passed"] = str(c.passed)
        out |= {f"{name}: {r.rule}": r.verdict for r in c.rules}
    return out


def gate(path: Path, committed: bytes | None, rebuilt: Path) -> Held:
    """The gate's record at `path` (a pipeline's results/…/gate.json), the commit's and the
    rebuild's."""
    held = Held("gate verdicts and chosen candidate")
    if committed is None:
        held.unchecked = f"the commit has no {path}"
        return held
    mine = rebuilt / path
    if not mine.is_file():
        held.unchecked = f"the rebuild has no {path}"
        return held
    if not mine.resolve().is_relative_to(rebuilt.resolve()):
        held.unchecked = f"the rebuild's {path} is a link leading outside it; it was not read"
        return held
    theirs, why = parse(mine, Decision)
    if theirs is None:
        held.unchecked = f"the rebuild's {path} is not a gate record ({why})"
        return held
    a, b = _verdicts(committed), _verdicts(mine.read_bytes())
    held.compared = len(a.keys() | b.keys())
    keys = sorted(a.keys() | b.keys())
    held.changed = [f"{k}: {a.get(k)} -> {b.get(k)}" for k in keys if a.get(k) != b.get(k)]
    return held


def _answers(lines: list[str]) -> dict[str, tuple[str, str]] | str:
    """id -> (intent, route) of a predictions file; or which line is not a prediction."""
    out = {}
    for n, text in enumerate(lines, 1):
        if text.strip():
            try:
                p = PredictionLine.model_validate_json(text)
            except ValidationError as e:
                field, found = first_problem(e)
                return f"line {n} is not a prediction ({field or 'the line'}: {found[:80]})"
            out[p.id] = (p.predicted, p.route)
    return out


def predictions(root: Path, rev: str, folders: list[str], rebuilt: Path) -> Held:
    """Every committed predictions/<m>/<set>.jsonl against the rebuild's, by item id."""
    from dvc.api import DVCFileSystem

    held = Held("predictions' intents and routes")
    fs = DVCFileSystem(str(root), rev=rev)
    for folder in folders:
        if not (rebuilt / folder).is_dir():
            held.unchecked = f"the rebuild has no {folder}"
            return held
        for mine in sorted((rebuilt / folder).rglob("*.jsonl")):
            rel = mine.relative_to(rebuilt).as_posix()
            if not mine.resolve().is_relative_to(rebuilt.resolve()):
                held.unchecked = f"the rebuild's {rel} is a link leading outside it; it was not read"
                return held
            try:
                with fs.open(rel, "r", encoding="utf-8") as f:
                    theirs = _answers(f.read().splitlines())
            except Exception:  # noqa: BLE001 - not in this cache nor a reachable remote
                held.unchecked = (
                    f"{rel} of {rev[:12]} is in neither this project's DVC cache nor a reachable remote "
                    f"(`dvc pull` at {rev[:12]}, or verify where that commit was built)"
                )
                return held
            try:
                ours = _answers(mine.read_text(encoding="utf-8").splitlines())
            except UnicodeDecodeError as e:
                ours = f"byte {e.start} is not UTF-8"
            for name, answers in ((f"{rev[:12]}'s", theirs), ("the rebuild's", ours)):
                if isinstance(answers, str):
                    held.unchecked = f"{name} {rel}: {answers}"
                    return held
            assert isinstance(theirs, dict) and isinstance(ours, dict)
            for item in sorted(theirs.keys() | ours.keys()):
                held.compared += 1
                if theirs.get(item) != ours.get(item):
                    held.changed.append(f"{rel} {item}: {theirs.get(item)} -> {ours.get(item)}")
    return held


def summary(holds: list[Held]) -> str:
    """One word for the exit status: held, changed, or unchecked."""
    if any(h.changed for h in holds):
        return "changed"
    return "unchecked" if any(h.unchecked or not h.compared for h in holds) else "held"
