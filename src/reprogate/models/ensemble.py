"""Family `ensemble`: a weighted sum of member models' calibrated log-probabilities.

Features of an ensemble are its members' calibrated log-probabilities per item ([n, K, C]);
the model is K non-negative weights, fitted on the calibration partition by `combine@e`.
The featurizer's key holds the sha256 of every member's weights and calibration, so cached
features are used only while the members are exactly the ones they were computed from.

With `ensemble.neighbours`, one more slice joins the members': a k-nearest-neighbour vote
over a frozen member's embeddings, its memory the train partition (and the negatives, as out
of scope) stored with the ensemble in assets/neighbours.safetensors. Its weight is fitted like
a member's, so it also serves as the vote's temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file
from torch import nn

from reprogate.models.base import Featurizer, FolderFiles
from reprogate.specs.families.ensemble import NeighboursConfig
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file

# A label no neighbour votes for keeps this much probability, so its log stays finite.
FLOOR = 1e-3


class Neighbours:
    """Cosine k-nearest-neighbour vote over a memory of labelled, L2-normalised embeddings."""

    def __init__(self, config: NeighboursConfig, embedding: torch.Tensor, label: torch.Tensor, n_out: int):
        # Kept as fp16 values (the file is half the size); every vote, in combine as in serving,
        # uses exactly these.
        self.config, self.n_out = config, n_out
        self.embedding = embedding.half().float()
        self.label = label.long()

    @classmethod
    def from_features(
        cls, config: NeighboursConfig, embedding: torch.Tensor, label: torch.Tensor, n_out: int
    ) -> Neighbours:
        return cls(config, nn.functional.normalize(embedding.float(), dim=1), label, n_out)

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], config: NeighboursConfig, n_out: int) -> Neighbours:
        """The memory as its file holds it (save)."""
        return cls(config, t["embedding"], t["label"], n_out)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"embedding": self.embedding.half().contiguous(), "label": self.label}, str(path))

    def log_probs(self, queries: torch.Tensor, batch: int = 1024) -> torch.Tensor:
        k = min(self.config.k, len(self.label))
        out = []
        for s in range(0, len(queries), batch):
            q = nn.functional.normalize(queries[s : s + batch].float(), dim=1)
            sim, idx = (q @ self.embedding.T).topk(k, dim=1)
            w = torch.softmax(sim.double() / self.config.temperature, 1)
            votes = torch.zeros(len(q), self.n_out, dtype=torch.float64).scatter_add_(1, self.label[idx], w)
            out.append(torch.log(votes * (1 - FLOOR) + FLOOR / self.n_out).float())
        return torch.cat(out) if out else torch.zeros(0, self.n_out)


class Member(Protocol):
    """A calibrated member as the ensemble scores it (a loaded model folder, see model_folder)."""

    name: str
    featurizer: Featurizer
    temperature: float

    def text_logits(self, texts: list[str]) -> torch.Tensor: ...

    def logits_for(self, feats) -> torch.Tensor: ...

    def split_logits(self, split: str) -> torch.Tensor: ...

    def split_features(self, split: str): ...


class EnsembleFeaturizer:
    truncated = 0  # members count their own

    def __init__(self, members: list[str], neighbours: NeighboursConfig | None, models_dir: Path):
        self.members, self.near = members, neighbours
        self.neighbours: Neighbours | None = None  # set by combine@e, or loaded with the model
        self.models_dir = models_dir  # where the member folders are (or a promoted copy)
        # Whoever loads the ensemble says how its members are loaded (and on which device):
        # models never import the code that reads a model folder.
        self.load_members: Callable[[], list[Member]] | None = None
        self._scorers: list[Member] | None = None
        self._key: tuple[Path, dict] | None = None
        # Each member's folder as its opener read it (bind); unbound (combine), read from disk.
        self._files_of: Callable[[str], FolderFiles] | None = None

    def scorers(self) -> list[Member]:
        if self._scorers is None:
            assert self.load_members is not None, "the ensemble's loader binds its members first"
            self._scorers = self.load_members()
        return self._scorers

    @staticmethod
    def _stack(logits_per_member) -> torch.Tensor:
        return torch.stack([torch.log_softmax(x.double() / t, -1).float() for x, t in logits_per_member], 1)

    def bind(
        self,
        files_of: Callable[[str], FolderFiles],
        open_member: Callable[[str], Member],
        fingerprint: Any,
        own: FolderFiles,
        n_out: int,
    ) -> None:
        """Bound by whoever opens the ensemble's folder (`own`, as read): each member's folder as
        read (`files_of`), how one is opened (on the ensemble's device), checked against the
        member files it was fitted on, hashed from the bytes the members then load."""
        first = files_of(self.members[0]).dir.parent if self.members else self.models_dir
        self.models_dir, self._files_of = first, files_of
        self.load_members = lambda: [open_member(m) for m in self.members]
        combined, now = fingerprint.members or {}, self.key()["members"]
        changed = sorted(m for m in now if now[m] != combined.get(m))
        if changed:
            raise UserError(
                f"{own.dir}: combined from other versions of {', '.join(changed)} than {first} "
                f"holds now (their weights or calibration changed since). Rerun `dvc repro "
                f"combine@{own.dir.name}` so the ensemble is fitted to its current members, or restore them."
            )
        if self.near is not None:
            memory = paths.NEIGHBOUR_MEMORY.as_posix()
            try:
                self.neighbours = Neighbours.from_tensors(own.tensors(memory), self.near, n_out)
            except KeyError as e:
                raise UserError(f"{own.dir / memory} cannot be read (no {e}); {own.damaged}") from None

    def parts(self) -> list[str]:
        """What each slice of the features is: the members, then the neighbour vote."""
        return self.members + (["neighbours"] if self.near else [])

    def _near_member(self) -> Member:
        return self.scorers()[self.members.index(self.near.member)]

    def _with_vote(self, stacked: torch.Tensor, embeddings) -> torch.Tensor:
        if self.near is None:
            return stacked
        assert self.neighbours is not None, "the neighbours' memory is loaded before scoring"
        return torch.cat([stacked, self.neighbours.log_probs(embeddings)[:, None]], 1)

    def encode(self, texts: list[str]) -> torch.Tensor:
        if self.near is None:
            return self._stack([(s.text_logits(texts), s.temperature) for s in self.scorers()])
        # The neighbours member's embeddings serve its head and the vote: encoded once.
        near = self._near_member()
        embeddings = near.featurizer.encode(texts)
        stacked = self._stack(
            [
                (s.logits_for(embeddings) if s is near else s.text_logits(texts), s.temperature)
                for s in self.scorers()
            ]
        )
        return self._with_vote(stacked, embeddings)

    def split(self, name: str) -> torch.Tensor:
        """Members' calibrated log-probabilities on a prepared split (their cached features)."""
        stacked = self._stack([(s.split_logits(name), s.temperature) for s in self.scorers()])
        return self._with_vote(stacked, self.member_split(name)) if self.near else stacked

    def member_split(self, name: str) -> torch.Tensor:
        """The neighbours member's cached embeddings of a prepared split."""
        return self._near_member().split_features(name)

    def encode_near(self, texts: list[str]) -> torch.Tensor:
        """The neighbours member's embeddings of texts it has no cached features of."""
        return self._near_member().featurizer.encode(texts)

    def collate(self, feats) -> dict[str, torch.Tensor]:
        return {"logp": torch.stack(list(feats))}

    def key(self) -> dict:
        # Members do not change while this process runs: hash their (large) weights once per folder.
        d = self.models_dir
        if self._key is None or self._key[0] != d:
            self._key = (
                d,
                {
                    "family": "ensemble",
                    **({"neighbours": self.near.model_dump()} if self.near else {}),
                    "members": {m: self._member_hashes(m) for m in self.members},
                },
            )
        return self._key[1]

    def _member_hashes(self, m: str) -> dict[str, str]:
        files = ("model.safetensors", "calibration.json")
        if self._files_of is not None:
            read = self._files_of(m)
            return dict(zip(("model", "calibration"), (read.sha256(f) for f in files), strict=True))
        d = self.models_dir / m
        return dict(zip(("model", "calibration"), (sha256_file(d / f) for f in files), strict=True))

    def config(self) -> dict:
        return {"members": self.members, **({"neighbours": self.near.model_dump()} if self.near else {})}

    def to_tensors(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logp": feats}

    def from_tensors(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        return t["logp"]


class EnsembleCombiner(nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.log_w = nn.Parameter(torch.zeros(k))

    def weights(self) -> torch.Tensor:
        return self.log_w.exp()

    def forward(self, logp: torch.Tensor) -> torch.Tensor:
        return (self.weights()[None, :, None] * logp).sum(1)


def build(spec: ModelSpec, n_out: int, root: Path):
    feat = EnsembleFeaturizer(spec.ensemble.members, spec.ensemble.neighbours, root / paths.MODELS)
    return EnsembleCombiner(len(feat.parts())), feat
