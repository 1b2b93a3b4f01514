"""Family `ensemble`: trained candidates' calibrated log-probabilities combined (and, optionally,
a nearest-neighbour vote over a frozen encoder's cached embeddings). Built from its members by
stage `combine`, never trained itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from reprogate.specs.base import ModelName, PosInt, Strict
from reprogate.specs.data import DataSpec
from reprogate.specs.family import Family, Refused
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths


class NeighboursConfig(Strict):
    member: ModelName = Field(
        description="A member of family encoder in mode frozen. Its cached embeddings of the train "
        "partition (and of the negatives, labelled out of scope, when it has an out-of-scope class) "
        "are the memory; a query's k most cosine-similar items vote for their labels."
    )
    k: PosInt = Field(30, le=1000, description="How many nearest training items vote.")
    temperature: float = Field(
        0.02,
        gt=0.0,
        le=1.0,
        description="Softmax temperature over the neighbours' cosine similarities: the smaller, the "
        "more the closest neighbours count.",
    )
    augmented: bool = Field(
        False,
        description="Also hold the member's embeddings of the data spec's augmented variants of the "
        "train rows (stage augment: typos, casing, fillers...), labelled as their source rows, so "
        "everyday spellings find neighbours of their own kind. Encoded once by combine; the data "
        "spec needs an `augment` section.",
    )


class EnsembleConfig(Strict):
    members: list[ModelName] = Field(
        min_length=2,
        max_length=4,
        description="Names of model specs (specs/models/NAME.yaml) whose calibrated log-probabilities "
        "are combined; each must also be listed in params.yaml.",
    )
    neighbours: NeighboursConfig | None = Field(
        None,
        description="Also combine a k-nearest-neighbour vote over a frozen member's embeddings, "
        "weighted like a member.",
    )

    @field_validator("members")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"members must be distinct, got {v}")
        return v


class Ensemble(Family):
    name = "ensemble"
    config = EnsembleConfig
    trained = False
    built_by = "combine"

    def sources(self, spec: Any) -> list[str]:
        return list(spec.ensemble.members)

    onnx = "reprogate.export.graphs.ensemble:onnx"
    build = "reprogate.models.ensemble:build"

    def references(self, spec: Any, root: Path) -> None:
        oos = set()
        for m in spec.ensemble.members:
            path = root / paths.model_spec(m)
            if not path.is_file():
                raise Refused((), f"ensemble.members names '{m}', but {path} does not exist")
            member = load_spec(path, ModelSpec)
            if not member.trained:
                raise Refused(
                    (),
                    f"ensemble.members: '{m}' is of family {member.family}, built from other candidates; "
                    "list the trained candidates it is built from instead",
                )
            if member.data != spec.data:
                raise Refused(
                    (),
                    f"ensemble.members: '{m}' uses data '{member.data}' but this ensemble uses '{spec.data}'",
                )
            oos.add(member.head.out_of_scope_class)
        if len(oos) > 1:
            raise Refused(
                (),
                "ensemble.members disagree on head.out_of_scope_class, so their outputs differ; "
                "make it the same for every member",
            )
        near = spec.ensemble.neighbours
        if near is None:
            return
        if near.member not in spec.ensemble.members:
            raise Refused(
                (),
                f"ensemble.neighbours.member is '{near.member}', which is not one of "
                f"ensemble.members {spec.ensemble.members}; name one of them",
            )
        member = load_spec(root / paths.model_spec(near.member), ModelSpec)
        if not member.family_def.caches_embeddings(member):
            raise Refused(
                (),
                f"ensemble.neighbours.member '{near.member}' is of family {member.family} and caches no "
                "sentence embeddings; the neighbours are searched in cached embeddings, which only a "
                "frozen encoder has: name a member of family encoder with mode frozen",
            )
        if near.augmented and load_spec(root / spec.data, DataSpec).augment is None:
            raise Refused(
                ("ensemble", "neighbours", "augmented"),
                f"ensemble.neighbours.augmented is true but the data spec {spec.data} has no 'augment' "
                "section, so there are no augmented rows to hold; add one there (e.g. `augment: "
                "{seed: 0}`) or set augmented to false",
            )
