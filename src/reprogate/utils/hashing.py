"""sha256 of a file, read in blocks (raw data, checkpoints and models can be large), and of a
value (content keys: the same value, on any machine, in any key order, gives the same key)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def content_key(value: object) -> str:
    """sha256 of `value` as canonical JSON (keys sorted, no spaces): a key derived from content,
    which a second import of the same content finds again."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
