"""Family `ngram` on an export's graph: its bags padded into a matrix."""

from __future__ import annotations

import torch
from torch import nn

from reprogate.export.graph import Input
from reprogate.models.ngram import NgramClassifier


class NgramMember(nn.Module):
    """An n-gram model with its bags padded into a matrix: the masked mean of the rows the ids
    pick is what EmbeddingBag(mode="mean") computes, in ops every runtime has."""

    def __init__(self, model: NgramClassifier):
        super().__init__()
        self.weight, self.head = model.bag.weight, model.head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bag = (self.weight[ids] * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(bag), bag


def onnx(scorer) -> tuple[nn.Module, list[Input]]:
    return NgramMember(scorer.model), [Input(scorer.name, "ngram", scorer.featurizer.config())]
