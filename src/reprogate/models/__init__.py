"""Model families: `ngram`, `encoder` (full, LoRA or frozen) and `ensemble`, each one module
with `build(spec, n_out, root) -> (module, featurizer)`; models/base.py says what they share."""

from __future__ import annotations

from pathlib import Path

from reprogate.models import encoder, ensemble, ngram
from reprogate.specs.model import ModelSpec

FAMILIES = {"ngram": ngram.build, "encoder": encoder.build, "ensemble": ensemble.build}


def build(spec: ModelSpec, n_out: int, root: Path):
    return FAMILIES[spec.family](spec, n_out, root)
