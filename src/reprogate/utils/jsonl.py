"""Line files (JSON Lines, one query per line): one record per line, both ways.

Written: json.dumps(..., ensure_ascii=False) keeps U+0085, U+2028 and U+2029 raw inside
strings; str.splitlines() and some JSON Lines readers break lines there, which would split one
prediction in two. They are written as \\u escapes instead: the same JSON value.
Read: split on newlines only, for the same reason, and a byte that is not UTF-8 is named by
file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reprogate.utils.errors import UserError

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def line(obj: Any, sort_keys: bool = False) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=sort_keys).translate(_LINE_BREAKS) + "\n"


def iter_lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each line, split on newlines only: str.splitlines would also split
    inside a query (or a JSON string) at U+2028, form feeds and the like. A UTF-8 BOM and CRLF
    line ends are dropped. Read one line at a time, at most `limit` bytes of it: a longer line
    is (number, None), and reading stops there, however much of the line is left."""
    with open(path, "rb") as f:
        number = 0
        while raw := f.readline(-1 if limit is None else limit + 1):
            number += 1
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if limit is not None and not raw.endswith(b"\n") and len(raw) > limit:
                yield number, None
                return
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{path}:{number}: byte 0x{raw[e.start]:02x} is not UTF-8 (column {e.start + 1} of "
                    f"this line); save the file as UTF-8 (for example `iconv -f latin1 -t utf-8 "
                    f"{path.name}`)."
                ) from None


def read_lines(path: Path) -> list[str]:
    """Every line of the file, as iter_lines reads them."""
    return [text for _, text in iter_lines(path) if text is not None]


def read_jsonl(path: Path) -> list[dict]:
    """A JSON Lines file reprogate wrote (prepared splits), one object per line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]
