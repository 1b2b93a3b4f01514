"""Model families. Each module offers `build(spec, n_out, root) -> (module, featurizer)`.

A featurizer turns texts into per-example features once (`encode`) and stacks a micro-batch
of them into tensors (`collate`); the module maps those tensors to logits. Both are
rebuilt from `models/<m>/config.json` at prediction time, without the training code.
"""

from __future__ import annotations

from pathlib import Path

from reprogate.specs import ModelSpec


def build(spec: ModelSpec, n_out: int, root: Path):
    if spec.family == "ngram":
        from reprogate.models import ngram

        return ngram.build(spec, n_out, root)
    from reprogate.models import encoder

    return encoder.build(spec, n_out, root)


def module_for(family: str) -> str:
    """Source file of a family, for exact DVC dependencies."""
    return f"models/{family}.py"
