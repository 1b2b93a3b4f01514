"""Family `screened` (specs/families/screened.py): its module and featurizer are the frozen
encoder's; what it adds is the texts its out-of-scope class learns beside the negatives.

`compose` makes them from the train partition only, never from a set the gate judges. Two kinds:
- two requests in one: two utterances of different intents joined by a connector people use
  between requests, so acting on either intent would drop the other;
- vague cores: a determiner and the noun after it ("my card", "the transfer"), alone or in a
  frame that still names no intent ("question about my card"), which 77 intents cannot tell
  apart. Texts are lowercased for it; normalisation does the rest where every text is scored.
Every draw comes from one seeded generator, so the texts are the same on every machine.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from reprogate.models import encoder
from reprogate.specs.families.screened import ComposeConfig

# Between two requests; "" is a comma or a new sentence, which normalisation turns into a space.
CONNECTORS = ("and", "also", "then", "plus", "but first", "and also", "and then", "as well as", "")
# A core is a determiner and the word after it where the noun phrase ends there (a verb, a
# preposition or the end follows: "my card is", "the app on"), so "my last" of "my last transfer"
# is not one; and it must be seen this often in train: a thing people name, not a chance phrase.
_END = r"is|was|has|have|had|to|for|from|on|in|at|of|with|yet|not|still|and|but|i|will|can|been|please"
CORE = re.compile(rf"\b(?:my|the|this|that|your)\s+[a-z]{{3,}}(?=\s+(?:{_END})\b|\s*[.?!,]|\s*$)")
CORE_MIN_SEEN = 5
FRAMES = ("{}", "{}", "about {}", "{} please", "question about {}", "help with {}", "its about {}")


def compose(train: list[dict], cfg: ComposeConfig) -> list[str]:
    """The composed texts (pairs, then cores), none equal to a train utterance, none repeated."""
    rng = random.Random(cfg.seed)
    short = [r for r in train if len(r["text"].split()) <= cfg.max_words]
    seen = {r["text"] for r in train}
    out: list[str] = []

    def keep(text: str) -> None:
        text = " ".join(text.split())
        if text not in seen:
            seen.add(text)
            out.append(text)

    for _ in range(cfg.pairs * 4):  # a pair already drawn is drawn again; bounded all the same
        if len(out) >= cfg.pairs or len(short) < 2:
            break
        a, b = rng.sample(short, 2)
        if a["label"] != b["label"]:
            keep(f"{a['text']} {rng.choice(CONNECTORS)} {b['text']}")
    seen_after = Counter(m.group(0) for r in train for m in CORE.finditer(r["text"].lower()))
    cores = sorted(c for c, n in seen_after.items() if n >= CORE_MIN_SEEN)
    wanted = len(out) + cfg.cores
    for _ in range(cfg.cores * 4):
        if len(out) >= wanted or not cores:
            break
        keep(rng.choice(FRAMES).format(rng.choice(cores)))
    return out


class _AsEncoder:
    """The spec as the encoder family's code reads it: `encoder` is this family's encoder section."""

    def __init__(self, spec: Any):
        self._spec, self.encoder = spec, spec.screened.encoder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def build(spec: Any, n_out: int, root: Path):
    return encoder.build(_AsEncoder(spec), n_out, root)


def export_assets(assets: Path, spec: Any, model: torch.nn.Module, featurizer) -> None:
    encoder.export_assets(assets, _AsEncoder(spec), model, featurizer)
