"""The pipeline params.yaml declares: its data spec and model specs, validated together.

A project has a default pipeline (dvc.yaml: params.yaml `models`) and may have a second one of
slower candidates (experiments/dvc.yaml: `experiments`), built on the default's data and members
and judged by a gate of its own beside the default's candidates. A language model's project
(lm/) has its own params.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_params, load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.reading import read_yaml
from reprogate.specs.text import TextSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError

Part = Literal["default", "experiments"]
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
    kind: Literal["classify", "lm"] = "classify"
    part: Part = "default"
    # The models this part's dvc.yaml builds (`models` holds them and what they build on).
    builds: tuple[str, ...] = ()

    @property
    def dvc_yaml(self) -> Path:
        return paths.DVC_YAML if self.part == "default" else paths.EXPERIMENTS / paths.DVC_YAML


def pipeline_kind(root: Path) -> Literal["classify", "lm"]:
    """What the project at `root` runs, from its data spec's kind (lm: a kind: text corpus)."""
    data = root / load_params(root).data
    return "lm" if data.is_file() and read_yaml(data).get("kind") == "text" else "classify"


def augments(p: Pipeline) -> bool:
    """Whether the pipeline's data spec makes augmented rows (stage augment)."""
    return p.kind == "classify" and load_spec(p.root / p.data, DataSpec).augment is not None


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
    load_spec(root / params.data, TextSpec if kind == "lm" else DataSpec)
    models = {}
    for n in names:
        m = load_spec(root / paths.model_spec(n), ModelSpec)
        if Path(m.data) != Path(params.data):
            raise UserError(
                f"specs/models/{n}.yaml: field 'data' is '{m.data}', but params.yaml runs the "
                f"pipeline on '{params.data}'; make them the same."
            )
        if (m.family == "causal_lm") != (kind == "lm"):
            raise UserError(
                f"specs/models/{n}.yaml: family '{m.family}' cannot run in a pipeline on "
                f"'{params.data}' ({'a text corpus' if kind == 'lm' else 'labelled rows'}): a language "
                "model's pipeline (family causal_lm, a kind: text corpus) has its own params.yaml, "
                "e.g. lm/params.yaml."
            )
        models[n] = m
    for n, m in models.items():
        missing = [x for x in (m.ensemble.members if m.ensemble else []) if x not in models]
        if m.export and m.export.source not in models:
            raise UserError(
                f"specs/models/{n}.yaml: export.source '{m.export.source}' is not in params.yaml "
                "'models' (or, for an experiment, 'experiments'); add it (the export is judged beside "
                "its source, and must agree with it)."
            )
        if missing:
            raise UserError(
                f"specs/models/{n}.yaml: ensemble.members {missing} are not in params.yaml 'models'; add "
                "them (each member is trained, checked and gated as a candidate of its own)."
            )
    builds = tuple(params.models if part == "default" else params.experiments)
    return Pipeline(root, params.data, models, params.gate, kind, part, builds)
