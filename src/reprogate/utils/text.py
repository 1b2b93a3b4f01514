"""The one form of a text that models see: at `prepare` (stored data) and at prediction.

A model trained on one spelling of a character must not meet another at serving time:
fullwidth letters, ligatures and no-break spaces (NFKC), typographic quotes and apostrophes
(phones and word processors type ’ for ') and runs of whitespace or newlines all reach the
model as the plain form it was trained on. Case and punctuation are left to the model.
"""

from __future__ import annotations

import unicodedata

# NFKC keeps these as they are; keyboards differ in which one they type.
_QUOTES = str.maketrans(
    {
        "\u2018": "'",  # left single quotation mark
        "\u2019": "'",  # right single quotation mark, the usual typographic apostrophe
        "\u201a": "'",
        "\u201b": "'",
        "\u02bc": "'",  # modifier letter apostrophe
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
    }
)


def canonical(text: str) -> str:
    """NFKC, ASCII quotes and apostrophes, whitespace runs folded to one space, ends trimmed."""
    return " ".join(unicodedata.normalize("NFKC", text).translate(_QUOTES).split())
