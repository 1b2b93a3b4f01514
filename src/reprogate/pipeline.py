"""What the pipeline runs: params.yaml's data, model and gate specs, validated together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from reprogate.errors import UserError
from reprogate.specs import DataSpec, GateSpec, ModelSpec, load_spec


@dataclass(frozen=True)
class Pipeline:
    root: Path
    data: str
    models: dict[str, ModelSpec]
    gate: str


def load_pipeline(root: Path) -> Pipeline:
    params_path = root / "params.yaml"
    if not params_path.is_file():
        raise UserError(f"{params_path}: not found; run reprogate from the project root.")
    params = yaml.safe_load(params_path.read_text()) or {}
    for key in ("data", "models", "gate"):
        if key not in params:
            raise UserError(f"{params_path}: field '{key}' is missing; see README for the layout.")
    names = params["models"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(
            f"{params_path}: field 'models' is {names!r}; write a list of model spec names, "
            "e.g. [ngram] for specs/models/ngram.yaml."
        )
    load_spec(root / params["data"], DataSpec)
    load_spec(root / params["gate"], GateSpec)
    models = {}
    for n in names:
        m = load_spec(root / "specs" / "models" / f"{n}.yaml", ModelSpec)
        if Path(m.data) != Path(params["data"]):
            raise UserError(
                f"specs/models/{n}.yaml: field 'data' is '{m.data}', but params.yaml runs the "
                f"pipeline on '{params['data']}'; make them the same."
            )
        models[n] = m
    for n, m in models.items():
        missing = [x for x in (m.ensemble.members if m.ensemble else []) if x not in models]
        if missing:
            raise UserError(
                f"specs/models/{n}.yaml: ensemble.members {missing} are not in params.yaml 'models'; add "
                "them (each member is trained, checked and gated as a candidate of its own)."
            )
    return Pipeline(root, params["data"], models, params["gate"])
