"""Family `flagged` (specs/families/flagged.py): a frozen encoder whose head has one output more
than the answers, "not one request", learnt from the texts models/screened.compose makes.

Training reads all n_out + 1 logits (the trainer puts the module in train mode). Scoring (eval
mode: every scorer, the export's graph) reads n_out log-probabilities: the flag's probability d
is spread over the answers (spread(), below), in a way that keeps the order of the answers, so
the argmax is the answer the head names among the answers alone; what d changes is how sure it is.
A query that is two requests, or too vague to act on, has no one answer, so it looks to the
routing policy like any query the model cannot decide: sent to review, its intent kept."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from reprogate.models import encoder


def spread(logits: torch.Tensor, keep: float) -> torch.Tensor:
    """n_out + 1 logits -> n_out log-probabilities: p'(y) = (1 - s d) q(y) + s d / n_out, where
    q is the head's distribution over the answers alone, d the flag's probability and
    s = 1 - keep the share of it spread evenly. keep > 0 leaves a sure flag's answers in q's
    order, which float32 cannot tell apart once the even share swamps them."""
    z = logits.float()
    flag = F.log_softmax(z, dim=-1)[..., -1:]
    answers = F.log_softmax(z[..., :-1], dim=-1)
    share = 1.0 - keep
    own = torch.log(1.0 - share * flag.exp()) + answers  # at least log(keep) + log q(y)
    even = math.log(share) + flag - math.log(z.shape[-1] - 1)
    # log(exp(own) + exp(even)) written out with its maximum, which every ONNX opset exports.
    top = torch.maximum(own, even)
    return top + torch.log(torch.exp(own - top) + torch.exp(even - top))


class FlaggedHead(nn.Module):
    def __init__(self, width: int, n_out: int, keep: float):
        super().__init__()
        self.keep = keep
        self.linear = nn.Linear(width, n_out + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.linear(x)
        return logits if self.training else spread(logits, self.keep)


class _AsEncoder:
    """The spec as the encoder family's code reads it: `encoder` is this family's encoder section."""

    def __init__(self, spec: Any):
        self._spec, self.encoder = spec, spec.config.encoder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def build(spec: Any, n_out: int, root: Path):
    model, featurizer = encoder.build(_AsEncoder(spec), n_out, root)
    model.head = FlaggedHead(model.head.in_features, n_out, spec.config.keep)
    return model, featurizer


def export_assets(assets: Path, spec: Any, model: torch.nn.Module, featurizer) -> None:
    encoder.export_assets(assets, _AsEncoder(spec), model, featurizer)
