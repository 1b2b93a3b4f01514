"""User-facing errors: one paragraph naming file, field, value and fix; never a traceback."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError


class UserError(Exception):
    """A mistake the user can fix. The CLI prints the message and exits 2, without traceback."""


def relative(message: str, root: Path) -> str:
    """`message` with the project's own location dropped from every path in it: what a user
    reads (and what a server shows its clients) names files as the project does, relative to
    its root, not where this host keeps it."""
    for prefix in sorted({str(root.absolute()), str(root.resolve())}, key=len, reverse=True):
        if prefix != os.sep:
            message = message.replace(prefix + os.sep, "")
    return message


def read_json(path: Path, fix: str) -> Any:
    """A JSON file reprogate wrote (a model's config, calibration, the production record),
    or one paragraph naming it and `fix` when it is missing or damaged (a truncated copy, a
    merge conflict)."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); {fix}") from None
    except RecursionError:
        raise UserError(f"{path} nests deeper than any file reprogate writes; {fix}") from None


def first_problem(err: ValidationError, skip: tuple[str, ...] = ()) -> tuple[str, str]:
    """The first field pydantic refused in a file reprogate wrote (evidence, a record), and what
    was wrong there: "missing", or the message and the value found. `skip` drops location parts
    the user never wrote, such as the tags of a tagged union."""
    first = err.errors(include_url=False)[0]
    field = ".".join(str(p) for p in first["loc"] if p not in skip)
    found = "missing" if first["type"] == "missing" else f"{first['msg']}, found {first['input']!r:.60}"
    return field, found


def _show(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _models_in(ann: Any) -> list[type[BaseModel]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in get_args(ann) for m in _models_in(a)]


def _walk(model: type[BaseModel], loc: tuple[int | str, ...]):
    """Follow an error location through the spec classes.

    Returns the location as a user wrote it (without the discriminator tags pydantic adds
    for tagged unions), the field's description, and the keys accepted where it points.
    """
    shown: list[str] = []
    current: list[type[BaseModel]] = [model]
    field = None
    for part in loc:
        if isinstance(part, int):
            shown.append(f"[{part}]")
            continue
        tagged = [
            m
            for m in current
            if "kind" in m.model_fields and part in get_args(m.model_fields["kind"].annotation)
        ]
        if len(current) > 1 and tagged:
            current = tagged
            continue
        owner = next((m for m in current if part in m.model_fields), None)
        if owner is None:
            # A dict key chosen by the user (an origin name, a file name, an eval set).
            shown.append(("." if shown else "") + str(part))
            continue
        field = owner.model_fields[part]
        shown.append(("." if shown else "") + str(part))
        current = _models_in(field.annotation)
    keys = sorted({k for m in current for k in m.model_fields})
    return "".join(shown) or "(top level)", getattr(field, "description", None), keys


_PATTERNS = {
    r"^[0-9a-f]{64}$": "write the file's sha256: 64 lowercase hex digits, as `sha256sum FILE` prints",
    r"^[0-9a-f]{40}$": "write a full 40-hex-digit commit id (immutable), never a branch or tag",
    r"^[a-z0-9][a-z0-9_-]*$": "use lowercase letters, digits, '-' and '_'",
    r"^[A-Za-z0-9][A-Za-z0-9_-]*$": "use letters, digits, '-' and '_': a plain name, never a path",
}

# What a user should write instead, by pydantic error type.
_FIXES = {
    "int_type": "write a whole number without quotes, e.g. 64",
    "int_parsing": "write a whole number without quotes, e.g. 64",
    "int_from_float": "write a whole number, e.g. 64",
    "float_type": "write a number without quotes, e.g. 0.001",
    "float_parsing": "write a number without quotes, e.g. 0.001",
    "bool_type": "write true or false",
    "string_type": "write a text value; quote it if YAML reads it as a number or as yes/no/on/off",
    "list_type": "write a YAML list, e.g. [a, b]",
    "dict_type": "write a YAML mapping (key: value lines)",
    "model_type": "write a YAML mapping (key: value lines)",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
    "too_short": "give more items",
    "too_long": "give fewer items",
}


def format_validation_error(path: Path | str, err: ValidationError, model: type[BaseModel]) -> str:
    """Render every pydantic error as a line naming file, field path, value and fix."""
    lines = [f"{path}: {err.error_count()} problem(s) in this spec:"]
    for e in err.errors(include_url=False):
        kind = e["type"]
        if kind == "extra_forbidden":
            parent, _, accepted = _walk(model, e["loc"][:-1])
            key = str(e["loc"][-1])
            close = difflib.get_close_matches(key, accepted, n=1)
            where = "" if parent == "(top level)" else f" under '{parent}'"
            hint = f"did you mean '{close[0]}'?" if close else "remove it."
            lines.append(
                f"  - field '{parent + '.' if where else ''}{key}': unknown key '{key}'{where}; "
                f"{hint} Accepted keys here: {', '.join(accepted)}."
            )
            continue
        loc, description, _ = _walk(model, e["loc"])
        if kind == "missing":
            extra = f" ({description})" if description else ""
            lines.append(f"  - field '{loc}': is required but missing; add it{extra}.")
            continue
        if kind == "value_error":
            # Our own rules already say what would be accepted.
            msg = e["msg"].removeprefix("Value error, ")
            if not e["loc"]:
                # Cross-field rules name their fields and values in the message itself.
                lines.append(f"  - {msg}.")
                continue
            lines.append(f"  - field '{loc}': value {_show(e.get('input'))}: {msg}.")
            continue
        if kind == "literal_error" or kind == "union_tag_invalid":
            fix = f"use one of {e.get('ctx', {}).get('expected', '')}"
        elif kind == "string_pattern_mismatch":
            fix = _PATTERNS.get(e["ctx"]["pattern"], description or f"match {e['ctx']['pattern']}")
        else:
            fix = _FIXES.get(kind, description or "see specs/schema/ for the accepted form")
        lines.append(f"  - field '{loc}': value {_show(e.get('input'))}: {e['msg']}; fix: {fix.rstrip('.')}.")
    return "\n".join(lines)
