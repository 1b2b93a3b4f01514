"""A loaded candidate as one torch module from text features to logits, the shape torch.onnx
exports: every member's network, an ensemble's calibrated combination and its neighbour vote.

Each member reads its own inputs, named `<member>.<input>` in the graph, so the runtime needs
only the member's preprocessing (a tokenizer, or n-gram hashing) to feed it. What the module
computes is what the source computes; the stage measures how far the exported runtime strays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from reprogate.folder.scorer import Scorer
from reprogate.models.encoder import EmbeddingFeaturizer, EncoderClassifier, TokenFeaturizer
from reprogate.models.ensemble import FLOOR, EnsembleFeaturizer, Neighbours
from reprogate.models.ngram import NgramClassifier, NgramFeaturizer
from reprogate.utils.errors import UserError


@dataclass(frozen=True)
class Input:
    """One member's preprocessing, as the runtime repeats it (assets/inputs.json)."""

    member: str
    kind: str  # "tokens" (a tokenizer's ids and mask) or "ngram" (hashed ids and mask)
    config: dict

    def names(self) -> tuple[str, str]:
        return (f"{self.member}.ids", f"{self.member}.mask")


class TokensMember(nn.Module):
    """An encoder member: ids and mask -> (logits, the pooled embedding its head reads)."""

    def __init__(self, encoder: nn.Module, pooler, head: nn.Linear):
        super().__init__()
        self.encoder, self.pooler, self.head = encoder, pooler, head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.pooler(self.encoder, ids, mask)
        return self.head(embedding), embedding


class NgramMember(nn.Module):
    """An n-gram member with its bags padded into a matrix: the masked mean of the rows the ids
    pick is what EmbeddingBag(mode="mean") computes, in ops every runtime has."""

    def __init__(self, model: NgramClassifier):
        super().__init__()
        self.weight, self.head = model.bag.weight, model.head

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bag = (self.weight[ids] * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(bag), bag


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


class Graph(nn.Module):
    """Logits of the source from every member's inputs (in `inputs` order, two per member)."""

    def __init__(self, members: list[nn.Module], weights: list[float] | None, temps: list[float], vote):
        super().__init__()
        self.members = nn.ModuleList(members)
        # A single model's logits pass through; an ensemble's are its weighted, calibrated sum.
        self.register_buffer("w", torch.tensor(weights or [], dtype=torch.float32))
        self.register_buffer("t", torch.tensor(temps, dtype=torch.float32))
        self.single, self.vote = weights is None, vote
        self.near = 0  # which member's embedding the vote reads

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        outs = [m(xs[2 * i], xs[2 * i + 1]) for i, m in enumerate(self.members)]
        if self.single:
            return outs[0][0]
        logp = [torch.log_softmax(logits / self.t[i], -1) for i, (logits, _) in enumerate(outs)]
        if self.vote is not None:
            logp.append(self.vote(outs[self.near][1]))
        return (self.w[:, None, None] * torch.stack(logp)).sum(0)


def member_module(scorer: Scorer) -> tuple[nn.Module, Input]:
    """One loaded (non-ensemble) model as a graph member, with the preprocessing it needs."""
    feat, model, name = scorer.featurizer, scorer.model, scorer.name
    if isinstance(feat, NgramFeaturizer):
        return NgramMember(model), Input(name, "ngram", feat.config())
    if isinstance(feat, EmbeddingFeaturizer):  # frozen: the encoder lives in the featurizer
        module = TokensMember(feat.encoder, feat.pooler, model.head)
    elif isinstance(feat, TokenFeaturizer) and isinstance(model, EncoderClassifier):
        encoder = model.encoder
        if hasattr(encoder, "merge_and_unload"):  # LoRA: adapters folded into the weights
            encoder = encoder.merge_and_unload()
        module = TokensMember(encoder, model.pooler, model.head)
    else:
        raise UserError(f"models/{name}: family {scorer.spec.family} cannot be exported to ONNX")
    return module, Input(name, "tokens", {"max_length": feat.max_length})


def build_graph(source: Scorer) -> tuple[Graph, list[Input]]:
    """The source (loaded on CPU) as one module, and its members' inputs in argument order."""
    feat = source.featurizer
    if not isinstance(feat, EnsembleFeaturizer):
        module, spec = member_module(source)
        return Graph([module], None, [1.0], None).eval(), [spec]
    scorers = feat.scorers()
    parts = [member_module(s) for s in scorers]
    weights = source.model.weights().detach().tolist()
    vote = Vote(feat.neighbours) if feat.near is not None else None
    graph = Graph([m for m, _ in parts], weights, [s.temperature for s in scorers], vote)
    if feat.near is not None:
        graph.near = feat.members.index(feat.near.member)
    return graph.eval(), [i for _, i in parts]
