"""models/production.json (promote writes it; the gate, predict and serve read it) and promote's journal."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from reprogate.records.base import CommitId, Interval, ModelVersion, Record, Sha256
from reprogate.specs.family import family
from reprogate.utils.errors import UserError
from reprogate.utils.paths import PRODUCTION


class PinnedPolicy(Record):
    temperature: float
    threshold: float
    margin: float
    two_requests: float | None = None
    ambiguous: float | None = None
    too_short: int | None = None


# The GTO stage `reprogate promote` tags (NAME#prod#N), and the subject of its commits.
PROMOTION_STAGE = "prod"


def is_promotion(subject: str, name: str | None = None) -> bool:
    """Whether a commit subject is one `reprogate promote` writes (for `name`, when given); a
    revert's is not."""
    return subject.startswith(f"promote {name} (" if name else "promote ")


# How to recover models/production.json, said wherever it is found damaged.
RESTORE_PRODUCTION = (
    "only `reprogate promote` writes it: restore the committed record with "
    "`git checkout HEAD -- models/production.json` (after a merge conflict, take one side whole)"
)


class ProductionRecord(Record):
    """models/production.json. Before the first promotion it holds {"model": null}."""

    model: str | None = None
    model_version: ModelVersion | None = None
    family: str | None = None
    artifacts: dict[str, str] | None = None
    data_sha256: dict[str, Sha256] = {}
    spec_hashes: dict[str, str] | None = None
    code_commit: CommitId | None = None
    heldout_accuracy: float | None = None
    heldout_accuracy_ci95: Interval | None = None
    val_bits_per_char: float | None = None  # a language model's, on its validation split
    calibration: PinnedPolicy | None = None
    gate: dict[str, dict[str, Any]] | None = None


class Promoted(ProductionRecord):
    """A production record with a model in it: what predict and serve answer with."""

    model: str
    model_version: ModelVersion

    @property
    def generates(self) -> bool:
        """A language model (no routing policy, no labels); records before `family` was kept
        were all classifiers'."""
        if self.family is None:
            return False
        try:
            return family(self.family).generates
        except ValueError as e:
            raise UserError(
                f"{PRODUCTION}: production holds {self.model} of family '{self.family}', which does not "
                f"load here ({e}). Install the package of that family, or promote another candidate."
            ) from None


class PromotionJournal(Record):
    """<git dir>/reprogate/promotion.json: a promotion checked at `base`, until committed and tagged."""

    base: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    model: str
    model_version: ModelVersion
    record: str  # models/production.json, byte for byte as it is committed
    message: str
    tag: str
    version_tag: str = ""  # GTO's <artifact>@v<semver>; made before `tag`
    project: str = ""  # the project's folder in the repository ("" at its top; lm/ for lm)
