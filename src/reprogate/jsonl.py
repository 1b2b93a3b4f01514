"""Line files (JSON Lines, one query per line): one record per line, both ways.

Written: json.dumps(..., ensure_ascii=False) keeps U+0085, U+2028 and U+2029 raw inside
strings; str.splitlines() and some JSON Lines readers break lines there, which would split one
prediction in two. They are written as \\u escapes instead: the same JSON value.
Read: split on newlines only, for the same reason, and a byte that is not UTF-8 is named by
file and line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reprogate.errors import UserError

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def line(obj: Any, sort_keys: bool = False) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=sort_keys).translate(_LINE_BREAKS) + "\n"


def read_lines(path: Path) -> list[str]:
    """The file's lines, split on newlines only: str.splitlines would also split inside a
    query (or a JSON string) at U+2028, form feeds and the like. A UTF-8 BOM and CRLF line ends
    are dropped."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_no = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(
            f"{path}:{line_no}: byte 0x{data[e.start]:02x} is not UTF-8 (column {column} of this "
            f"line); save the file as UTF-8 (for example `iconv -f latin1 -t utf-8 {path.name}`)."
        ) from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def read_jsonl(path: Path) -> list[dict]:
    """A JSON Lines file reprogate wrote (prepared splits), one object per line."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]
