"""A `screened` model's training run: the classifier's (train/run.py), with the texts
models/screened.compose makes from the train partition added as out-of-scope rows. A `flagged`
model's run (train/flagged.py) is this one with the texts as an output of their own.

They are encoded here, by the frozen encoder the run already holds; their sha256 joins the data
hash, so a checkpoint made with other composed texts is never resumed."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from reprogate.data.prepared import Example, TrainData, rows
from reprogate.models.base import concat
from reprogate.models.screened import compose
from reprogate.train import run
from reprogate.train.runs import Paths
from reprogate.utils.console import say


class Setup(run.Setup):
    said = "out of scope"  # what the composed texts are taught as
    tag: tuple[str, ...] = ()  # joins their digest: the same texts taught as something else differ

    @classmethod
    def added_rows(cls, root: Path, spec) -> int:
        return len(compose(rows(root, "train"), spec.config.compose))

    def composed_label(self) -> int:
        return len(self.data.labels) - 1  # the out-of-scope class, last (the family requires one)

    def __init__(self, root: Path, paths: Paths):
        super().__init__(root, paths)
        t0 = time.perf_counter()
        composed = compose(rows(root, "train"), self.spec.config.compose)
        label = self.composed_label()
        self.feats = concat(self.feats, self.featurizer.encode(composed))
        digest = hashlib.sha256("\n".join([*self.tag, *composed]).encode()).hexdigest()
        self.data = TrainData(
            self.data.examples + [Example(t, label) for t in composed],
            self.data.labels,
            hashlib.sha256(f"{self.data.data_hash}{digest}".encode()).hexdigest(),
        )
        self.encode_s += time.perf_counter() - t0
        self.total_steps = run.checked_total_steps(self.spec, paths.spec, len(self.feats))
        self.fingerprint = run.fingerprint(self.spec, self.data, self.device, self.featurizer)
        took = time.perf_counter() - t0
        say(f"train: {paths.name}: {len(composed)} composed texts as {self.said}, encoded in {took:.1f} s")
