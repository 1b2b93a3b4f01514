"""A `flagged` model's training run: the classifier's (train/run.py), with the texts
models/screened.compose makes from the train partition added as rows of the head's extra
output, "not one request" (models/flagged.py), which comes after every answer.

Those rows weigh as out-of-scope rows do (head.out_of_scope_weight; 1 without an out-of-scope
class), as they did in family screened, so the two families differ in where the texts go and
nothing else. Their sha256 and the family's name join the data hash: a checkpoint made with
other composed texts, or with them as out of scope, is never resumed."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from reprogate.data.prepared import Example, TrainData, rows
from reprogate.models.base import concat
from reprogate.models.screened import compose
from reprogate.train import run
from reprogate.train.objectives import Classification
from reprogate.train.runs import Paths
from reprogate.train.trainer import Trainer
from reprogate.utils.console import say


class FlagObjective(Classification):
    """Cross-entropy over the answers and the flag; the out-of-scope class is the next to last."""

    def __init__(self, spec, featurizer, feats, labels: list[int], n_classes: int, device):
        super().__init__(spec, featurizer, feats, labels, n_classes, device)
        if self.class_weight is not None:  # set on the last output, the flag: out of scope too
            self.class_weight[-2] = self.class_weight[-1]


class Setup(run.Setup):
    def __init__(self, root: Path, paths: Paths):
        super().__init__(root, paths)
        t0 = time.perf_counter()
        composed = compose(rows(root, "train"), self.spec.config.compose)
        flag = len(self.data.labels)
        self.feats = concat(self.feats, self.featurizer.encode(composed))
        digest = hashlib.sha256("\n".join(["flagged", *composed]).encode()).hexdigest()
        self.data = TrainData(
            self.data.examples + [Example(t, flag) for t in composed],
            self.data.labels,
            hashlib.sha256(f"{self.data.data_hash}{digest}".encode()).hexdigest(),
        )
        self.encode_s += time.perf_counter() - t0
        self.total_steps = run.checked_total_steps(self.spec, paths.spec, len(self.feats))
        self.fingerprint = run.fingerprint(self.spec, self.data, self.device, self.featurizer)
        took = time.perf_counter() - t0
        n = len(composed)
        say(f"train: {paths.name}: {n} composed texts as 'not one request', encoded in {took:.1f} s")

    def trainer(self) -> Trainer:
        model, _ = self._build()
        labels = [e.label for e in self.data.examples]
        objective = FlagObjective(
            self.spec, self.featurizer, self.feats, labels, len(self.data.labels) + 1, self.device
        )
        return Trainer(self.spec, model, objective, self.device, self.total_steps)
