"""params.yaml: which specs the pipeline runs (no `kind`: it is the pipeline's own file)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from reprogate.specs.base import Folders, ModelName, Strict

CpuLevel = Literal["x86-64-v2", "x86-64-v3", "x86-64-v4", "native"]
Gemm = Literal["portable", "level"]


class Numerics(Strict):
    """The numeric environment every stage process runs in (see numerics.py): the code paths
    the math libraries take, fixed before torch or numpy loads, so that a commit reproduces
    bitwise on any CPU that meets the level, not only on the one that made it."""

    cpu_level: CpuLevel = Field(
        "x86-64-v3",
        description="the x86-64 micro-architecture level every float kernel is held to: x86-64-v2 "
        "(SSE4.2), x86-64-v3 (AVX2 + FMA: most x86 CPUs since 2015), x86-64-v4 (AVX-512); it fixes "
        "ATen's CPU capability, MKL's conditional numerical reproducibility branch, oneDNN's and "
        "fbgemm's instruction sets, numpy's SIMD dispatch and OpenBLAS's kernels (deterministic "
        "algorithms are always on). `native` pins "
        "nothing: each CPU takes its own fastest paths and a commit reproduces only on its own "
        "kind of CPU",
    )
    gemm: Gemm = Field(
        "portable",
        description="MKL's branch for torch's matrix products: `portable` (MKL_CBWR=COMPATIBLE, SSE2 "
        "without the approximate rcpps/rsqrtps, Intel's documented branch for the same results on "
        "Intel and AMD CPUs; about 2.4x slower products, measured) or `level` (the branch of "
        "cpu_level: faster, but MKL ignores it on AMD CPUs, so a commit reproduces only on CPUs of "
        "the vendor that made it). Ignored with cpu_level `native`",
    )


class Params(Strict):
    """params.yaml: which specs the pipeline runs (no `kind`: it is the pipeline's own file)."""

    data: str = Field(description="the data spec, e.g. specs/data/banking77.yaml")
    models: list[ModelName] = Field(
        min_length=1, description="model spec names, e.g. [ngram] for specs/models/ngram.yaml"
    )
    experiments: list[ModelName] = Field(
        default_factory=list,
        description="the slower candidates (fine-tunes, exports, larger encoders): model spec names "
        "built by a second pipeline, experiments/dvc.yaml (`make repro-experiments`), on the default "
        "pipeline's data and members; its gate judges them beside `models`",
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
    numerics: Numerics = Field(
        default_factory=Numerics,
        description="the pinned numeric environment of every stage process (threads are each model "
        "spec's `threads`)",
    )
