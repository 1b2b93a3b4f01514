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


class PairedClassification(Classification):
    """Classification plus SetFit-style sentence pairs (model spec encoder.contrastive).

    Each in-scope text of a micro-batch is paired with another text of its intent. The partners
    are drawn from a generator seeded by the spec's seed and the micro-batch's own indices, so a
    resumed run draws the same pairs (the sampler's order decides them, nothing else). The pair
    loss is InfoNCE over the batch: an anchor's partner must be the most cosine-similar of every
    partner and every out-of-scope text in the batch, partners of its own intent left out (they
    are not negatives). Its sum is weighted and added to the head's cross-entropy sum."""

    def __init__(self, spec, featurizer, feats, labels: list[int], n_classes: int, device):
        super().__init__(spec, featurizer, feats, labels, n_classes, device)
        cfg = spec.encoder.contrastive
        self.weight, self.temperature, self.seed = cfg.weight, cfg.temperature, spec.seed
        self.oos = n_classes - 1 if spec.head.out_of_scope_class else None
        by_label: dict[int, list[int]] = {}
        for i, y in enumerate(labels):
            by_label.setdefault(y, []).append(i)
        self.by_label = {y: np.array(ix) for y, ix in by_label.items()}

    def partners(self, anchors: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng([self.seed, *(int(i) for i in anchors)])
        out = []
        for i in anchors:
            pool = self.by_label[int(self.labels[i])]
            j = pool[rng.integers(len(pool))]
            if j == i and len(pool) > 1:  # never the anchor itself when its intent has another text
                j = pool[(np.searchsorted(pool, i) + 1) % len(pool)]
            out.append(int(j))
        return np.array(out, dtype=np.int64)

    def loss_sum(self, model, idx, autocast) -> torch.Tensor:
        idx = np.asarray(idx)
        y = self.labels[idx]
        inside = (y != self.oos).numpy() if self.oos is not None else np.ones(len(idx), bool)
        anchors = idx[inside]
        mates = self.partners(anchors)
        collated = self.featurizer.collate([self.feats[i] for i in (*idx, *mates)])
        batch = {k: v.to(self.device) for k, v in collated.items()}
        with autocast():
            pooled = model.embed(**batch)
            logits = model.head(model.dropout(pooled[: len(idx)]))
        loss = F.cross_entropy(
            logits.float(), y.to(self.device), weight=self.class_weight, reduction="sum",
            label_smoothing=self.label_smoothing,
        )  # fmt: skip
        if len(anchors) < 2:
            return loss
        z = F.normalize(pooled.float(), dim=-1)
        a, others = z[: len(idx)][torch.from_numpy(inside)], z[len(idx) :]
        outside = z[: len(idx)][torch.from_numpy(~inside)]
        candidates = torch.cat([others, outside])
        sim = a @ candidates.T / self.temperature
        ya = y[torch.from_numpy(inside)].to(self.device)
        yc = torch.cat([ya, torch.full((len(outside),), -1, device=self.device)])
        own = torch.eye(len(a), len(candidates), dtype=torch.bool, device=self.device)
        same = (ya[:, None] == yc[None, :]) & ~own
        sim = sim.masked_fill(same, float("-inf"))
        target = torch.arange(len(a), device=self.device)
        return loss + self.weight * F.cross_entropy(sim, target, reduction="sum")


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
