"""A `flagged` model's training run: the classifier's (train/run.py), with the texts
models/screened.compose makes from the train partition added as rows of the head's extra
output, "not one request" (models/flagged.py), which comes after every answer.

Those rows weigh as out-of-scope rows do (head.out_of_scope_weight; 1 without an out-of-scope
class), as they did in family screened, so the two families differ in where the texts go and
nothing else. Their sha256 and the family's name join the data hash: a checkpoint made with
other composed texts, or with them as out of scope, is never resumed."""

from __future__ import annotations

from reprogate.train import screened
from reprogate.train.objectives import Classification
from reprogate.train.trainer import Trainer


class FlagObjective(Classification):
    """Cross-entropy over the answers and the flag; the out-of-scope class is the next to last."""

    def __init__(self, spec, featurizer, feats, labels: list[int], n_classes: int, device):
        super().__init__(spec, featurizer, feats, labels, n_classes, device)
        if self.class_weight is not None:  # set on the last output, the flag: out of scope too
            self.class_weight[-2] = self.class_weight[-1]


class Setup(screened.Setup):
    said = "'not one request'"
    tag = ("flagged",)

    def composed_label(self) -> int:
        return len(self.data.labels)  # the flag, after every answer

    def trainer(self) -> Trainer:
        model, _ = self._build()
        labels = [e.label for e in self.data.examples]
        objective = FlagObjective(
            self.spec, self.featurizer, self.feats, labels, len(self.data.labels) + 1, self.device
        )
        return Trainer(self.spec, model, objective, self.device, self.total_steps)
