"""What a /predict request may cost before it is queued, and whether its client is still there.

A text costs one model row, plus one per clause when the model's two-requests rule scores its
clauses alone (predict/requests.py). Without a bound, `"a b, " * 200` is 200 rows and 64 such
texts held the model for 48 s while every other client waited. So a text may have at most
MAX_CLAUSES clauses (far above what a person says in one query: a 1,000-character text with
three real clauses costs four rows) and a request at most MAX_REQUEST_ROWS rows; past either it
is refused with 422 and the numbers, before it waits for anything.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from reprogate.predict.requests import clauses
from reprogate.utils.text import canonical

MAX_CLAUSES = 16
MAX_REQUEST_ROWS = 512


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Bounds:
    """What one request may cost (`reprogate serve --max-clauses`, `--max-request-rows`)."""

    clauses: int = MAX_CLAUSES
    request_rows: int = MAX_REQUEST_ROWS


def rows(texts: list[str], scores_clauses: bool, bounds: Bounds = Bounds()) -> list[int]:
    """Each text's model rows, or Refused (422) naming the first text or the request over a bound."""
    out = []
    for i, t in enumerate(texts):
        # Counted on the text as the model reads it (whitespace runs folded, as evaluation's
        # prepared texts are): linear, where the raw `" " * 999 + "x"` took the cut 60 ms.
        n = len(clauses(canonical(t))) if scores_clauses else 0
        if n > bounds.clauses:
            raise Refused(
                422,
                f"query {i} has {n} clauses (cut at and, also, then, commas, semicolons), and each is "
                f"scored on its own; at most {bounds.clauses} are (reprogate serve --max-clauses): send "
                "the parts as separate queries",
            )
        out.append(1 + n)
    if sum(out) > bounds.request_rows:
        raise Refused(
            422,
            f"this request costs {sum(out)} model rows (a query is one, plus one per clause); at most "
            f"{bounds.request_rows} are taken at once (reprogate serve --max-request-rows): send fewer "
            "queries per request",
        )
    return out


async def client_left(receive: Any) -> None:
    """Returns when the ASGI server says the client disconnected (the body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)
