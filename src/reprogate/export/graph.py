"""A loaded candidate as one torch module from text features to logits, the shape torch.onnx
exports. Each family that can be exported says how in its declaration (specs/family.py: `onnx`,
one module per family under export/graphs/): a function of its loaded scorer that returns a
module from its inputs to (logits, the embedding its head reads) and the inputs it reads.

Each member reads its own inputs, named `<member>.<input>` in the graph, so the runtime needs
only the member's preprocessing (a tokenizer, or n-gram hashing) to feed it. What the module
computes is what the source computes; the stage measures how far the exported runtime strays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from reprogate.utils.errors import UserError

# The preprocessing export/runtime.py repeats: a tokenizer's ids and mask, or n-gram hashing.
KINDS = ("tokens", "ngram")


@dataclass(frozen=True)
class Input:
    """One member's preprocessing, as the runtime repeats it (assets/inputs.json)."""

    member: str
    kind: str  # "tokens" (a tokenizer's ids and mask) or "ngram" (hashed ids and mask)
    config: dict
    # Files the runtime reads for it, written to assets/<member>/<name> (a tokenizer.json), as
    # the member's folder was read.
    files: dict[str, bytes] = field(default_factory=dict, compare=False)

    def names(self) -> tuple[str, str]:
        return (f"{self.member}.ids", f"{self.member}.mask")


class Graph(nn.Module):
    """The logits of what a family's `onnx` built, from every input in `inputs` order."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.inner(*xs)[0]


def family_graph(scorer: Any) -> tuple[nn.Module, list[Input]]:
    """What the scorer's family builds for an export (its declaration's `onnx`), or one paragraph
    saying that the family cannot be exported."""
    declared = scorer.spec.family_def
    build = declared.part("onnx")
    if build is None:
        raise UserError(
            f"models/{scorer.name}: family {declared.name} declares no ONNX graph (its `onnx`), so it "
            "cannot be exported; export a candidate of a family that does (ngram, encoder, ensemble)"
        )
    module, inputs = build(scorer)
    for i in inputs:
        if i.kind not in KINDS:
            raise UserError(
                f"models/{scorer.name}: family {declared.name}'s onnx gives member {i.member!r} inputs "
                f"of kind {i.kind!r}; the runtime repeats {' or '.join(KINDS)} preprocessing only: "
                "return one of those from its onnx"
            )
    return module, inputs


def build_graph(source: Any) -> tuple[Graph, list[Input]]:
    """The source (loaded on CPU) as one module, and its members' inputs in argument order."""
    inner, inputs = family_graph(source)
    return Graph(inner).eval(), inputs
