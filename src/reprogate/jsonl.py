"""JSON Lines: one object per line, readable by any line splitter.

json.dumps(..., ensure_ascii=False) keeps U+0085, U+2028 and U+2029 raw inside strings;
str.splitlines() and some JSON Lines readers break lines there, which would split one
prediction in two. They are written as \\u escapes instead: the same JSON value.
"""

from __future__ import annotations

import json
from typing import Any

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def line(obj: Any, sort_keys: bool = False) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=sort_keys).translate(_LINE_BREAKS) + "\n"
