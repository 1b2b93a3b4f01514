"""The classifier families' torch code: `ngram`, `encoder` (full, LoRA or frozen), `ensemble`,
each one module with `build(spec, n_out, root) -> (module, featurizer)` that its declaration
(specs/families/) names; models/base.py says what they share. This __init__ imports none of them:
a stage imports the family its model names, through `build`."""

from __future__ import annotations

from pathlib import Path

from reprogate.specs.model import ModelSpec


def build(spec: ModelSpec, n_out: int, root: Path):
    return spec.family_def.part("build")(spec, n_out, root)
