"""What the trainer minimises: one object per kind of model, the loop is the same for all.

An objective says how many examples an epoch draws from (`n`), how many loss terms a set of
them adds (`items`: the update's loss is their sum over the update's items, so gradient
accumulation equals one big batch), and the summed loss of a micro-batch (`loss_sum`).

Classification: one example is one text, one term its cross-entropy. Language modelling: one
example is a window of `context + 1` tokens starting at any position of the train stream (an
epoch is a permutation of every start), one term per predicted token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F


class Objective(Protocol):
    n: int

    def items(self, idx: np.ndarray) -> int: ...

    def loss_sum(self, model: torch.nn.Module, idx: np.ndarray, autocast: Callable) -> torch.Tensor: ...


class Classification:
    def __init__(self, spec, featurizer, feats, labels: list[int], n_classes: int, device):
        self.featurizer, self.feats, self.device, self.n = featurizer, feats, device, len(feats)
        self.labels = torch.tensor(labels, dtype=torch.long)
        self.label_smoothing = spec.label_smoothing
        self.class_weight = None
        w = spec.head.out_of_scope_weight
        if spec.head.out_of_scope_class and w != 1.0:
            # The out-of-scope class is the last output; None keeps the unweighted sum bitwise.
            self.class_weight = torch.ones(n_classes, device=device)
            self.class_weight[-1] = w

    def items(self, idx: np.ndarray) -> int:
        return len(idx)

    def loss_sum(self, model, idx, autocast) -> torch.Tensor:
        collated = self.featurizer.collate([self.feats[i] for i in idx])
        batch = {k: v.to(self.device) for k, v in collated.items()}
        y = self.labels[idx].to(self.device)
        with autocast():
            logits = model(**batch)
        return F.cross_entropy(
            logits.float(), y, weight=self.class_weight, reduction="sum", label_smoothing=self.label_smoothing
        )


class NextToken:
    def __init__(self, tokens: torch.Tensor, context: int, device):
        if len(tokens) <= context:
            raise ValueError(f"{len(tokens)} train tokens do not fill one window of {context} + 1")
        self.tokens, self.context, self.device = tokens.long(), context, device
        self.n = len(tokens) - context  # window starts: every target position has a window
        self.offsets = torch.arange(context + 1)

    def items(self, idx: np.ndarray) -> int:
        return len(idx) * self.context

    def windows(self, idx: np.ndarray) -> torch.Tensor:
        return self.tokens[torch.from_numpy(np.asarray(idx, dtype=np.int64))[:, None] + self.offsets]

    def loss_sum(self, model, idx, autocast) -> torch.Tensor:
        w = self.windows(idx).to(self.device)
        with autocast():
            logits = model(w[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
