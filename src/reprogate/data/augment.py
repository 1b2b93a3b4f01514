"""What stage `augment` runs: seeded, readable variants of the train partition's rows.

People type "dont", "pls", "my card got nicked in Lisbon"; BANKING77's writers mostly did not.
Each transform below is a rule a reviewer can read and check against the written file
(data/augmented/train.jsonl keeps the source row's id and text beside every variant):

- typos: one or two words of four letters or more get a neighbouring-key slip, a dropped, doubled
  or swapped letter;
- casing: all lower case, ALL CAPS, or a lower-case "i";
- fillers: a spoken opener or closer ("um", "hey", "quick question,", "please", "thanks");
- contractions: "do not" <-> "don't" either way, and apostrophes dropped ("hasnt");
- currencies: a currency word or symbol swapped for another currency of the list below;
- countries: a country name swapped for another of the list below.

The word lists are general knowledge written here, never read from an evaluation set; a variant
is built from a train row only, and one whose normalised text equals a held-out, validation,
calibration or evaluation row is dropped and counted, as prepare drops such train rows.
Variant k of row i draws from numpy's generator seeded (seed, i, k): the file is byte-identical
for the same spec and prepared data.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from reprogate.data.prepare import normalize
from reprogate.specs.data import DataSpec
from reprogate.utils import paths
from reprogate.utils.jsonl import line, read_jsonl

Rng = np.random.Generator

OPENERS = ("um ", "hey ", "hi ", "so ", "ok so ", "quick question, ", "hello, ", "sorry, ")
CLOSERS = (" please", " pls", " thanks", " thank you", " asap", " cheers")
CONTRACTIONS = {
    "do not": "don't",
    "does not": "doesn't",
    "did not": "didn't",
    "is not": "isn't",
    "are not": "aren't",
    "was not": "wasn't",
    "has not": "hasn't",
    "have not": "haven't",
    "cannot": "can't",
    "can not": "can't",
    "will not": "won't",
    "would not": "wouldn't",
    "could not": "couldn't",
    "i am": "i'm",
    "it is": "it's",
    "what is": "what's",
    "that is": "that's",
    "there is": "there's",
    "i have": "i've",
    "you are": "you're",
}
CURRENCIES = (
    "euros", "pounds", "dollars", "yen", "pesos", "rupees", "francs", "kroner", "zloty", "baht",
    "rand", "lira", "forints", "won", "yuan", "dirhams", "shekels", "ringgit", "koruna", "leu",
)  # fmt: skip
CURRENCY = re.compile(
    r"(?<![\w$£€])(euros?|pounds?|dollars?|usd|gbp|eur|yen|pesos?|rupees?|francs?|[$£€])(?![\w])",
    re.IGNORECASE,
)
COUNTRIES = (
    "France", "Spain", "Italy", "Germany", "Portugal", "Greece", "Poland", "Hungary", "Turkey",
    "Japan", "China", "India", "Thailand", "Vietnam", "Mexico", "Brazil", "Argentina", "Canada",
    "Australia", "Egypt", "Morocco", "Kenya", "Nigeria", "Norway", "Sweden", "Ireland", "Austria",
    "the UK", "the US", "the USA", "England", "Scotland", "Croatia", "Peru", "Chile", "Indonesia",
)  # fmt: skip
COUNTRY = re.compile(r"\b(" + "|".join(re.escape(c) for c in COUNTRIES) + r")\b", re.IGNORECASE)
KEYBOARD = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _neighbours(ch: str) -> str:
    for row in KEYBOARD:
        i = row.find(ch)
        if i >= 0:
            return row[max(0, i - 1) : i] + row[i + 1 : i + 2]
    return ""


def typos(text: str, rng: Rng) -> str | None:
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha()]
    if not long:
        return None
    for i in rng.choice(long, size=min(len(long), int(rng.integers(1, 3))), replace=False):
        w = words[i]
        j = int(rng.integers(1, len(w) - 1))  # first letter kept: people rarely slip there
        slip = int(rng.integers(4))
        near = _neighbours(w[j].lower())
        if slip == 0 and near:
            w = w[:j] + near[int(rng.integers(len(near)))] + w[j + 1 :]
        elif slip == 1:
            w = w[:j] + w[j + 1 :]
        elif slip == 2:
            w = w[:j] + w[j] + w[j:]
        else:
            w = w[: j - 1] + w[j] + w[j - 1] + w[j + 1 :]
        words[i] = w
    return " ".join(words)


def casing(text: str, rng: Rng) -> str | None:
    choice = int(rng.integers(3))
    if choice == 0:
        return text.lower()
    if choice == 1:
        return text.upper()
    return re.sub(r"\bI\b", "i", text) if re.search(r"\bI\b", text) else text.lower()


def fillers(text: str, rng: Rng) -> str | None:
    body = text.rstrip("?.! ")
    if rng.random() < 0.5:
        return OPENERS[int(rng.integers(len(OPENERS)))] + body[:1].lower() + body[1:]
    return body + CLOSERS[int(rng.integers(len(CLOSERS)))]


def contractions(text: str, rng: Rng) -> str | None:
    lower = text.lower()
    out = text
    for long_form, short in CONTRACTIONS.items():
        if re.search(rf"\b{re.escape(long_form)}\b", lower):
            out = re.sub(rf"\b{re.escape(long_form)}\b", short, out, flags=re.IGNORECASE)
        elif re.search(rf"\b{re.escape(short)}", lower) and rng.random() < 0.5:
            out = re.sub(rf"\b{re.escape(short)}", long_form, out, flags=re.IGNORECASE)
    out = out.replace("'", "").replace("\u2019", "") if rng.random() < 0.7 else out
    return out if out != text else None


def _swap(pattern: re.Pattern, options: tuple[str, ...]) -> Callable[[str, Rng], str | None]:
    def swap(text: str, rng: Rng) -> str | None:
        found = pattern.findall(text)
        if not found:
            return None
        others = [o for o in options if o.lower() not in {f.lower() for f in found}]
        new = others[int(rng.integers(len(others)))]
        return pattern.sub(new, text)

    return swap


TRANSFORMS: dict[str, Callable[[str, Rng], str | None]] = {
    "typos": typos,
    "casing": casing,
    "fillers": fillers,
    "contractions": contractions,
    "currencies": _swap(CURRENCY, CURRENCIES),
    "countries": _swap(COUNTRY, COUNTRIES),
}


def variant(text: str, names: list[str], rng: Rng) -> tuple[str, list[str]]:
    """One variant: the row's swaps (currency, country) and contractions always when they apply,
    then one or two of the other transforms, in the spec's order."""
    applied = []
    for name in names:
        if name in ("currencies", "countries", "contractions"):
            new = TRANSFORMS[name](text, rng)
            if new is not None and new != text:
                text, applied = new, [*applied, name]
    rest = [n for n in names if n not in ("currencies", "countries", "contractions")]
    if rest:
        picked = set(rng.choice(len(rest), size=min(len(rest), int(rng.integers(1, 3))), replace=False))
        for i, name in enumerate(rest):
            new = TRANSFORMS[name](text, rng) if i in picked else None
            if new is not None and new != text:
                text, applied = new, [*applied, name]
    return text, applied


def augment(root: Path, spec: DataSpec) -> dict[str, Any]:
    """Write data/augmented/train.jsonl; returns the counts metrics/augment.json records."""
    cfg = spec.augment
    assert cfg is not None
    prepared = root / paths.PREPARED
    train = read_jsonl(prepared / "train.jsonl")
    key = lambda t: normalize(t, spec.normalization)  # noqa: E731
    # Every row a model is judged or calibrated on: a variant equal to one would leak it.
    seen = {key(r["text"]) for f in sorted(prepared.glob("*.jsonl")) for r in read_jsonl(f)}
    counts: Counter[str] = Counter()
    out = root / paths.AUGMENTED
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for i, r in enumerate(train):
            for k in range(cfg.copies):
                text, applied = variant(r["text"], cfg.transforms, np.random.default_rng([cfg.seed, i, k]))
                norm = key(text)
                if not applied or norm in seen:
                    same = not applied or norm == key(r["text"])
                    counts["dropped_unchanged" if same else "dropped_seen"] += 1
                    continue
                seen.add(norm)
                counts.update(applied)
                counts["rows"] += 1
                row = {"id": f"{r['id']}~{k}", "label": r["label"], "text": text}
                f.write(line({**row, "source_id": r["id"], "source_text": r["text"], "transforms": applied}))
    tmp.replace(out)
    return {"source_rows": len(train), "copies": cfg.copies, "seed": cfg.seed, **dict(sorted(counts.items()))}


def summary(m: dict[str, Any]) -> str:
    each = ", ".join(f"{n} {m.get(n, 0)}" for n in TRANSFORMS if n in m)
    return (
        f"augment: {m['rows']} variants of {m['source_rows']} train rows ({each}); dropped "
        f"{m.get('dropped_unchanged', 0)} unchanged and {m.get('dropped_seen', 0)} equal to a row "
        "already seen"
    )
