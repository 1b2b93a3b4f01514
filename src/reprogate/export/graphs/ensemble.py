"""Family `ensemble` on an export's graph: every member's graph (each by its own family's
`onnx`), their calibrated, weighted combination and the neighbour vote."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from reprogate.export.graph import Input, family_graph
from reprogate.models.ensemble import FLOOR, Neighbours


class Vote(nn.Module):
    """The ensemble's k-nearest-neighbour vote (models/ensemble.Neighbours) on the graph."""

    def __init__(self, neighbours: Neighbours):
        super().__init__()
        # Stored transposed, so the similarity is one MatMul reading it directly (kept float).
        self.register_buffer("memory_t", neighbours.embedding.T.contiguous())
        self.register_buffer("label", neighbours.label.clone())
        self.k = min(neighbours.config.k, len(neighbours.label))
        self.temperature, self.n_out = neighbours.config.temperature, neighbours.n_out

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        sim, idx = (F.normalize(embedding, dim=1) @ self.memory_t).topk(self.k, dim=1)
        w = torch.softmax(sim / self.temperature, 1)
        votes = embedding.new_zeros((embedding.shape[0], self.n_out)).scatter_add(1, self.label[idx], w)
        return torch.log(votes * (1 - FLOOR) + FLOOR / self.n_out)


class Combined(nn.Module):
    """The weighted sum of the members' calibrated log-probabilities (and the vote's)."""

    def __init__(self, members: list[nn.Module], arity: list[int], weights: list[float], temps: list[float]):
        super().__init__()
        self.members, self.arity = nn.ModuleList(members), arity
        self.register_buffer("w", torch.tensor(weights, dtype=torch.float32))
        self.register_buffer("t", torch.tensor(temps, dtype=torch.float32))
        self.vote: Vote | None = None
        self.near = 0  # which member's embedding the vote reads

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs, at = [], 0
        for member, n in zip(self.members, self.arity, strict=True):
            outs.append(member(*xs[at : at + n]))
            at += n
        logp = [torch.log_softmax(logits / self.t[i], -1) for i, (logits, _) in enumerate(outs)]
        if self.vote is not None:
            logp.append(self.vote(outs[self.near][1]))
        combined = (self.w[:, None, None] * torch.stack(logp)).sum(0)
        # (logits, embedding) as every family's graph returns; an ensemble has no embedding of
        # its own, and none reads one (an ensemble is never another's member).
        return combined, combined


def onnx(scorer) -> tuple[nn.Module, list[Input]]:
    feat = scorer.featurizer
    scorers = feat.scorers()
    built = [family_graph(s) for s in scorers]
    inputs = [i for _, ins in built for i in ins]
    arity = [2 * len(ins) for _, ins in built]
    weights = scorer.model.weights().detach().tolist()
    module = Combined([m for m, _ in built], arity, weights, [s.temperature for s in scorers])
    if feat.near is not None:
        module.vote = Vote(feat.neighbours)
        module.near = feat.members.index(feat.near.member)
    return module, inputs
