"""The pipeline params.yaml declares: its data spec and model specs, validated together.

A project has a default pipeline (dvc.yaml: params.yaml `models`) and may have a second one of
slower candidates (experiments/dvc.yaml: `experiments`), built on the default's data and members
and judged by a gate of its own beside the default's candidates. A language model's project
(lm/) has its own params.yaml.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reprogate.specs.data import DataSpec
from reprogate.specs.loader import kind_of, load_params, load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.reading import read_yaml
from reprogate.specs.text import TextSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError

Part = Literal["default", "experiments"]
Kind = Literal["classify", "lm"]
# What each pipeline kind learns from: its data spec's class (a data spec of kind text makes lm).
DATA_SPECS: dict[str, type[DataSpec | TextSpec]] = {"classify": DataSpec, "lm": TextSpec}
PARTS: tuple[Part, ...] = ("default", "experiments")


@dataclass(frozen=True)
class Pipeline:
    """What the pipeline runs: params.yaml's data and model specs, validated together. The gate
    spec is named here, and read by the stages that judge (calibrate, evaluate, gate): a threshold's
    edit never reruns a training stage."""

    root: Path
    data: str
    models: dict[str, ModelSpec]
    gate: str
    # classify: a data spec of labelled rows; lm: a text corpus (kind: text) and causal_lm models.
    kind: Kind = "classify"
    part: Part = "default"
    # The models this part's dvc.yaml builds (`models` holds them and what they build on).
    builds: tuple[str, ...] = ()


def pipeline_kind(root: Path) -> Kind:
    """What the project at `root` runs, from its data spec's kind (lm: a kind: text corpus)."""
    data = root / load_params(root).data
    said = read_yaml(data).get("kind") if data.is_file() else None
    return next((k for k, cls in DATA_SPECS.items() if said == kind_of(cls)), "classify")  # type: ignore[return-value]


def augments(p: Pipeline) -> bool:
    """Whether the pipeline's data spec makes augmented rows (stage augment)."""
    return getattr(load_spec(p.root / p.data, DATA_SPECS[p.kind]), "augment", None) is not None


def features_source(p: Pipeline, name: str) -> str:
    """The model whose `features@` stage writes model `name`'s features: the first trained model
    in the pipeline's order (the default pipeline's before the experiments') whose stage would
    write the same files (its family's shared_features, and the same data, out-of-scope class and
    augmented rows), else `name` itself."""
    key = _features_key(p.models[name])
    if key is None:
        return name
    return next(n for n, m in p.models.items() if _features_key(m) == key)


def _features_key(spec: ModelSpec) -> str | None:
    if not spec.trained or (shared := spec.family_def.shared_features(spec)) is None:
        return None
    rows = {"data": spec.data, "out_of_scope": spec.head.out_of_scope_class, "augment": spec.augment}
    return json.dumps({**rows, "features": shared}, sort_keys=True)


def features_name(root: Path, name: str) -> str:
    """features_source for a model of the project at `root`; `name` itself for one params.yaml
    does not list (a spec trained by hand, a test's)."""
    params = load_params(root) if (root / paths.PARAMS).is_file() else None
    if params is None or name not in (*params.models, *params.experiments):
        return name
    return features_source(load_pipeline(root, "default" if name in params.models else "experiments"), name)


def load_pipeline(root: Path, part: Part = "default") -> Pipeline:
    params = load_params(root)
    both = sorted(set(params.models) & set(params.experiments))
    if both:
        raise UserError(
            f"{root / paths.PARAMS}: {both} listed under both 'models' and 'experiments'; a candidate "
            "is built by one pipeline: keep it under one of them."
        )
    names = [*params.models, *(params.experiments if part == "experiments" else [])]
    for field, value in (("data", params.data), ("gate", params.gate)):
        if not (root / value).resolve().is_relative_to(root.resolve()):
            raise UserError(
                f"{root / paths.PARAMS}: field '{field}' is '{value}', which is outside the project; "
                "the pipeline's specs live in it: point it at a file under specs/."
            )
    kind = pipeline_kind(root)
    load_spec(root / params.data, DATA_SPECS[kind])
    models = {}
    for n in names:
        m = load_spec(root / paths.model_spec(n), ModelSpec)
        if Path(m.data) != Path(params.data):
            raise UserError(
                f"specs/models/{n}.yaml: field 'data' is '{m.data}', but params.yaml runs the "
                f"pipeline on '{params.data}'; make them the same."
            )
        if m.family_def.kind != kind:
            raise UserError(
                f"specs/models/{n}.yaml: family '{m.family}' cannot run in a pipeline on "
                f"'{params.data}' (a data spec of kind {kind_of(DATA_SPECS[kind])}): a language "
                "model's pipeline (family causal_lm, a kind: text corpus) has its own params.yaml, "
                "e.g. lm/params.yaml."
            )
        models[n] = m
    for n, m in models.items():
        missing = [x for x in m.family_def.sources(m) if x not in models]
        if missing:
            raise UserError(
                f"specs/models/{n}.yaml: family {m.family} is built from {missing}, which are not in "
                "params.yaml 'models' (or, for an experiment, 'experiments'); add them (each is trained, "
                "checked and gated as a candidate of its own, and an export is judged beside its source)."
            )
    builds = tuple(params.models if part == "default" else params.experiments)
    return Pipeline(root, params.data, models, params.gate, kind, part, builds)
