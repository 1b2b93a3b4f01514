"""Family `flagged`: the screened family's frozen encoder and composed texts, with "not one
request" as an output of its own instead of a share of the out-of-scope class.

Screened taught two-in-one and vague requests as out of scope, and paid for it in accuracy: a
loosely phrased request near a composed pair lost its intent, not only its action
(docs/results.md, issue 53). Here the head has one output more than the answers. The composed
texts train that output; scoring spreads its probability over every answer
(models/flagged.py), so the answer the head names is the one it names without the detector, and
only its confidence falls. The routing policy, fitted on calibration data like any other
candidate's, then sends low-confidence answers to review as it always does.

Declared as an entry point of this package (pyproject.toml), as screened is."""

from __future__ import annotations

from pydantic import Field, model_validator

from reprogate.specs.families.screened import Screened, ScreenedConfig


class FlaggedConfig(ScreenedConfig):
    # Not tuned on any set: 0.1 caps a sure flag's top answer at 0.1 + 0.9 / n_out (0.11 for
    # BANKING77's 78 answers), far under any confidence a routing policy acts on, while the
    # answers keep an order float32 can hold.
    keep: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="How much of the answers' own distribution a sure 'not one request' flag leaves; "
        "the rest of its probability is spread evenly over every answer.",
    )

    @model_validator(mode="after")
    def _some(self) -> FlaggedConfig:
        if self.compose.pairs == 0 and self.compose.cores == 0:
            raise ValueError(
                "flagged.compose asks for 0 pairs and 0 cores, which gives its 'not one request' "
                "output nothing to learn; ask for some of either, or use family encoder"
            )
        return self


class Flagged(Screened):
    name = "flagged"
    config = FlaggedConfig
    build = "reprogate.models.flagged:build"
    assets = "reprogate.models.flagged:export_assets"
    setup = "reprogate.train.flagged:Setup"
    needs_out_of_scope = False
