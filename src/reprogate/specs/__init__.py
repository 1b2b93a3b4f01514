"""Every spec kind: data, model, gate and params.yaml, and the one loader that reads them.

Read them in this order: base (shared types), data, text, lm, model, gate, params, reading (bounded YAML),
roots (where a spec may reach), loader.
"""

from reprogate.specs.base import FOLDERS, OOS_LABEL, Strict, spec_hash
from reprogate.specs.data import (
    DataSpec,
    EvalSet,
    HfSource,
    LocalSource,
    Normalization,
    Origin,
    Table,
    UrlSource,
)
from reprogate.specs.gate import GateSpec
from reprogate.specs.lm import CausalLmConfig, PlanSpec, TokenizerConfig, speed_fields
from reprogate.specs.loader import (
    SPEC_KINDS,
    Pipeline,
    augments,
    find_root,
    iter_spec_files,
    json_schemas,
    load_params,
    load_pipeline,
    load_spec,
    pipeline_kind,
    resolve_encoder_path,
)
from reprogate.specs.model import ModelSpec, NeighboursConfig, training_hash
from reprogate.specs.params import Params
from reprogate.specs.reading import read_yaml
from reprogate.specs.roots import allowed_roots, confine, mirror_dirs
from reprogate.specs.text import TextSpec

__all__ = [
    "FOLDERS",
    "allowed_roots",
    "confine",
    "mirror_dirs",
    "OOS_LABEL",
    "SPEC_KINDS",
    "CausalLmConfig",
    "DataSpec",
    "PlanSpec",
    "TextSpec",
    "TokenizerConfig",
    "speed_fields",
    "EvalSet",
    "GateSpec",
    "HfSource",
    "LocalSource",
    "ModelSpec",
    "NeighboursConfig",
    "Normalization",
    "Origin",
    "Params",
    "Pipeline",
    "Strict",
    "Table",
    "UrlSource",
    "find_root",
    "iter_spec_files",
    "json_schemas",
    "load_params",
    "augments",
    "load_pipeline",
    "load_spec",
    "pipeline_kind",
    "read_yaml",
    "resolve_encoder_path",
    "spec_hash",
    "training_hash",
]
