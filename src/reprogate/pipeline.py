"""What the pipeline runs: params.yaml's data, model and gate specs, validated together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reprogate.errors import UserError
from reprogate.specs import DataSpec, GateSpec, ModelSpec, load_params, load_spec

# The production record (written only by `reprogate promote`, read by the gate and serving).
PRODUCTION = Path("models/production.json")
RESTORE_PRODUCTION = (
    "only `reprogate promote` writes it: restore the committed record with "
    "`git checkout HEAD -- models/production.json` (after a merge conflict, take one side whole)"
)
# A copy of each promoted model's files (an ensemble's members too), by model version:
# production answers from here after a retrain, and a reverted promotion finds its files.
PROMOTED = Path("models/.promoted")


@dataclass(frozen=True)
class Pipeline:
    root: Path
    data: str
    models: dict[str, ModelSpec]
    gate: str


def load_pipeline(root: Path) -> Pipeline:
    params = load_params(root)
    load_spec(root / params.data, DataSpec)
    load_spec(root / params.gate, GateSpec)
    models = {}
    for n in params.models:
        m = load_spec(root / "specs" / "models" / f"{n}.yaml", ModelSpec)
        if Path(m.data) != Path(params.data):
            raise UserError(
                f"specs/models/{n}.yaml: field 'data' is '{m.data}', but params.yaml runs the "
                f"pipeline on '{params.data}'; make them the same."
            )
        models[n] = m
    for n, m in models.items():
        missing = [x for x in (m.ensemble.members if m.ensemble else []) if x not in models]
        if missing:
            raise UserError(
                f"specs/models/{n}.yaml: ensemble.members {missing} are not in params.yaml 'models'; add "
                "them (each member is trained, checked and gated as a candidate of its own)."
            )
    return Pipeline(root, params.data, models, params.gate)
