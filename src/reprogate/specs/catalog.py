"""Every spec kind by its `kind:`: what `reprogate validate` and `reprogate schema` read a file of
any kind with. The stages never import this module: each loads the kinds it runs with
(specs/loader.py), so its dvc.yaml dependencies name those kinds' modules and no others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reprogate.specs.base import Strict
from reprogate.specs.data import DataSpec
from reprogate.specs.gate import GateSpec
from reprogate.specs.lm import PlanSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec, schema_class
from reprogate.specs.reading import read_yaml
from reprogate.specs.text import TextSpec
from reprogate.utils.errors import UserError

SPEC_KINDS: dict[str, type[Strict]] = {
    "data": DataSpec,
    "text": TextSpec,
    "model": ModelSpec,
    "gate": GateSpec,
    "plan": PlanSpec,
}


def load_any(path: Path) -> Strict:
    """A spec file of whichever kind its `kind:` names."""
    kind = read_yaml(Path(path)).get("kind")
    if not isinstance(kind, str) or kind not in SPEC_KINDS:
        raise UserError(
            f"{path}: field 'kind' is {kind!r}; expected one of {sorted(SPEC_KINDS)}. "
            "Add e.g. 'kind: model' as the first line."
        )
    return load_spec(path, SPEC_KINDS[kind])


def iter_spec_files(folders: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in folders:
        if p.is_dir():
            files += sorted(
                f for f in p.rglob("*.y*ml") if f.suffix in (".yaml", ".yml") and "schema" not in f.parts
            )
        elif p.exists():
            files.append(p)
        else:
            raise UserError(f"{p}: no such file or folder; give a spec file or a folder of specs.")
    return files


def json_schemas() -> dict[str, dict[str, Any]]:
    """Each kind's JSON Schema; a model spec's with every built-in family's section (a family of
    your own validates through its own config class, which no committed schema can know)."""
    classes = {**SPEC_KINDS, "model": schema_class()}
    return {kind: cls.model_json_schema() for kind, cls in classes.items()}
