"""Scoring a token stream whole: every token after the first predicted exactly once.

Windows of the model's context, each starting where the last one's targets ended: window w
reads ids[s : s + context] and is scored on ids[s + 1 : s + context + 1], s = w * context (the
last window is shorter). No window is sampled and none is skipped, so the number is the
split's, not an estimate; a target early in its window sees less context, as it does in
nanoGPT's estimate (there the windows are drawn at random).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Scored:
    nats: float  # summed over the predicted tokens
    tokens: int
    windows: int

    @property
    def nats_per_token(self) -> float:
        return self.nats / self.tokens


def score(model: torch.nn.Module, ids: torch.Tensor, context: int, device, batch: int = 64) -> Scored:
    ids = ids.long()
    n = len(ids) - 1
    starts = list(range(0, n, context))
    full = [s for s in starts if s + context <= n]
    nats, was_training = 0.0, model.training
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(full), batch):
            s = torch.tensor(full[i : i + batch])[:, None] + torch.arange(context + 1)
            w = ids[s].to(device)
            logits = model(w[:, :-1]).float()
            nats += float(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum"))
        if len(full) < len(starts):  # the shorter last window
            w = ids[starts[-1] :].to(device)[None]
            logits = model(w[:, :-1]).float()
            nats += float(F.cross_entropy(logits[0], w[0, 1:], reduction="sum"))
    model.train(was_training)
    return Scored(nats, n, len(starts))


def bits(nats: float, count: int) -> float:
    return nats / math.log(2) / count
