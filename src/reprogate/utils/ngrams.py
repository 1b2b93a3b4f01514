"""Hashed word and character n-grams of a text: the `ngram` family's features, computed the
same way by the torch model and by an exported runtime (which must not need torch to hash).

Hashing uses CRC32 (stable across processes and machines; Python's hash() is salted), so
the same text always maps to the same buckets and a saved model needs no vocabulary file.
"""

from __future__ import annotations

import re
import zlib

TOKEN = re.compile(r"\w+|[^\w\s]")


def ngram_ids(text: str, word: tuple[int, int], char: tuple[int, int], buckets: int) -> list[int]:
    words = TOKEN.findall(text.casefold())
    grams = [
        "w" + " ".join(words[i : i + n])
        for n in range(word[0], word[1] + 1)
        for i in range(len(words) - n + 1)
    ]
    for w in words:
        padded = f"<{w}>"
        grams += [
            "c" + padded[i : i + n] for n in range(char[0], char[1] + 1) for i in range(len(padded) - n + 1)
        ]
    # Bucket 0 is kept for texts with no n-gram at all, so every bag is non-empty.
    return [1 + zlib.crc32(g.encode()) % (buckets - 1) for g in grams] or [0]
