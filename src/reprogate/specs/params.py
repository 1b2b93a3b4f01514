"""params.yaml: which specs the pipeline runs (no `kind`: it is the pipeline's own file)."""

from __future__ import annotations

from pydantic import Field

from reprogate.specs.base import Folders, ModelName, Strict


class Params(Strict):
    """params.yaml: which specs the pipeline runs (no `kind`: it is the pipeline's own file)."""

    data: str = Field(description="the data spec, e.g. specs/data/banking77.yaml")
    models: list[ModelName] = Field(
        min_length=1, description="model spec names, e.g. [ngram] for specs/models/ngram.yaml"
    )
    gate: str = Field(description="the gate spec, e.g. specs/gate.yaml")
    mirror: Folders = Field(
        default_factory=list, description="folders tried for raw data files before any download"
    )
    data_roots: Folders = Field(
        default_factory=list,
        description="folders outside the project that data specs may read (data kept on another "
        "disk); a spec's paths must resolve inside the project, the mirror, or one of these",
    )
    registry: str = Field(
        default="registry",
        min_length=1,
        description="where `reprogate registry sync` keeps its Delta Lake tables: a folder (relative "
        "to the project; git-ignored by default) or any URI deltalake accepts (s3://, gs://, abfss://, "
        "a Unity Catalog volume path)",
    )
