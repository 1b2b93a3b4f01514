"""Family `screened` (specs/families/screened.py): its module and featurizer are the frozen
encoder's; what it adds is the texts its out-of-scope class learns beside the negatives.

`compose` makes them from the train partition only, never from a set the gate judges. Two kinds:
- two requests in one: two utterances of different intents joined by a connector people use
  between requests, so acting on either intent would drop the other;
- vague cores: a determiner and the noun after it ("my card", "the transfer"), alone or in a
  frame that still names no intent ("question about my card"), which 77 intents cannot tell
  apart.
Every draw comes from one seeded generator, so the texts are the same on every machine.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch

from reprogate.models import encoder
from reprogate.specs.families.screened import ComposeConfig

# Between two requests; "" is a comma or a new sentence, which normalisation turns into a space.
CONNECTORS = ("and", "also", "then", "plus", "but first", "and also", "and then", "as well as", "")
CORE = re.compile(r"\b(?:my|the|a|an|this|that|your|our)\s+[a-z]{3,}\b")
FRAMES = ("{}", "{}", "about {}", "{} please", "question about {}", "help with {}", "its about {}", "{} help")


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
    cores = sorted({m.group(0) for r in train for m in CORE.finditer(r["text"])})
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
