"""Queries for `reprogate predict`: from the command line or a file, read in bounded memory.

A file is read one line at a time, and never more than a line's bound of bytes at once: a 1 GB
file without a newline costs one bounded read, not the machine's memory. Every query is
checked (not empty, not over the character bound, UTF-8, a JSON object with "text" in .jsonl)
and named by its file and line, so output line i always answers input line i.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from reprogate.utils.errors import UserError
from reprogate.utils.jsonl import iter_lines

# The server's bound on one query (serve.py refuses longer ones with a 422), and predict's default.
MAX_QUERY_CHARS = 1000
SUFFIXES = (".txt", ".jsonl", "")


def _line_bytes(max_chars: int, jsonl: bool) -> int:
    """The most bytes a line of an accepted query can take: 4 per character in UTF-8, 6 for a
    JSON \\u escape, plus room for the JSON object around it and the line end."""
    return max_chars * (6 if jsonl else 4) + (4096 if jsonl else 2)


def _too_long(at: str, max_chars: int) -> UserError:
    return UserError(
        f"{at}: the query is over {max_chars} characters (the server's bound too); shorten or split "
        "it, or raise the bound with --max-chars if such queries are meant."
    )


def _text_of(line: str, at: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{at}: not valid JSON ({e.msg}); write one object per line.") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise UserError(f'{at}: each line needs a string field "text", e.g. {{"text": "..."}}.')
    return obj["text"]


def check(text: str, at: str, max_chars: int) -> str:
    """`text`, or one paragraph naming `at` and what is wrong with the query there."""
    if not text.strip():
        # Refused rather than skipped: output line i answers input line i.
        raise UserError(f"{at}: the query is empty; give every query some text or remove it.")
    if len(text) > max_chars:
        raise _too_long(at, max_chars)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        # Python turns undecodable argv bytes, and JSON's "\ud800"-style escapes, into these.
        raise UserError(
            f"{at}: the query holds {text[e.start]!r}, an unpaired surrogate, not a Unicode "
            "character (bytes that were not UTF-8, or a broken \\u escape); send UTF-8 text."
        ) from None
    return text


def from_file(path: Path, max_chars: int) -> Iterator[str]:
    """Every query of a .txt (one per line) or .jsonl ({"text": ...} per line) file, checked."""
    is_jsonl = path.suffix.lower() == ".jsonl"
    for number, line in iter_lines(path, _line_bytes(max_chars, is_jsonl)):
        at = f"{path}:{number}"
        if line is None:
            raise _too_long(at, max_chars)
        yield check(_text_of(line, at) if is_jsonl else line, at, max_chars)


def open_input(path: Path, max_chars: int) -> int:
    """Check a whole input file before anything is predicted (so a refusal leaves no partial
    output anywhere, stdout included); the number of queries in it."""
    if not path.is_file():
        raise UserError(f"{path}: no such input file; give a .txt (one query per line) or .jsonl file.")
    if path.suffix.lower() not in SUFFIXES:
        # A CSV or JSON file read as lines would predict on its header and its syntax.
        raise UserError(
            f"{path}: --input takes a .txt file (one query per line) or a .jsonl file (one "
            f'{{"text": ...}} object per line), not {path.suffix}; convert it, or rename it to .txt '
            "if it really is one query per line."
        )
    count = sum(1 for _ in from_file(path, max_chars))
    if count == 0:
        raise UserError(f"{path}: holds no query; put one query per line.")
    return count


def from_args(texts: list[str], max_chars: int) -> list[str]:
    if not texts:
        raise UserError("nothing to predict: give one or more texts, or --input FILE.")
    return [check(t, f"query {i} on the command line", max_chars) for i, t in enumerate(texts, 1)]
