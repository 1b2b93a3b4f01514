"""Family `export`: another candidate's model compiled for a serving runtime (ONNX Runtime).

The export is a candidate of its own: calibrate, evaluate and the gate judge the exported
runtime exactly as it serves, so a quantized model that loses accuracy or calibration is
refused by the same rules as any other, and one more rule asks that it agree with its source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from reprogate.specs.base import ModelName, PosInt, Strict
from reprogate.specs.family import Family, Refused
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths

# Train texts whose activation ranges fix an int8_static export's scales.
STATIC_SAMPLE = 512
# What says how int8 products are made, and means nothing to a float32 graph.
INT8_ONLY = ("per_channel", "reduce_range", "float_after")


class ExportConfig(Strict):
    source: ModelName = Field(
        description="The candidate to export (specs/models/NAME.yaml, listed in params.yaml): family "
        "ngram, encoder or ensemble. Its weights, its members' and its calibrated temperatures go "
        "into one ONNX graph from text features to the ensemble's logits."
    )
    format: Literal["onnx"] = "onnx"
    quantize: Literal["none", "int8", "int8_static"] = Field(
        "int8",
        description="int8: ONNX Runtime's dynamic quantization of the graph's matrix products "
        "(weights int8 once, activations per call). int8_static: activations too are quantized "
        f"with ranges fixed once, the float graph's minimum and maximum over {STATIC_SAMPLE} texts "
        "of the train partition (a seeded sample). none: the float32 graph.",
    )
    per_channel: bool = Field(True, description="int8: one scale per output channel of a weight.")
    reduce_range: bool = Field(
        True,
        description="int8: 7-bit weights. On x86-64 without VNNI (AVX2, AVX-512 before Cascade Lake) "
        "the u8s8 product can saturate with 8 bits; ONNX Runtime recommends 7 there.",
    )
    float_after: list[Literal["Gelu", "Relu", "LayerNormalization"]] = Field(
        default_factory=list,
        description="int8: matrix products whose input is the output of one of these operators stay "
        "float32. [Gelu] keeps a transformer's feed-forward down-projections float, the products "
        "whose inputs are where activation outliers, which stretch a per-call 8-bit range over the "
        "whole tensor, are most often found.",
    )
    opset: int = Field(20, ge=18, le=23, description="ONNX operator set of the exported graph.")
    batch: PosInt | None = Field(
        None,
        le=4096,
        description="Texts per runtime call, sorted by length. Default 16 for float32 (a request of 64 "
        "queries runs as 4 calls: less padding, 1.8x the q/s of one call of 64 here) and for "
        "int8_static, whose scales are fixed; 1 for int8, whose activation scales are computed per "
        "call, so that a query's answer never depends on what it is batched with and the gate "
        "judges exactly what a lone query gets.",
    )

    @model_validator(mode="after")
    def _quantized_only(self) -> ExportConfig:
        # A float32 graph has no int8 products: a setting for them would be read by no one. Only
        # values other than the defaults are refused, so a saved spec (every field) reads back.
        defaults = {f: type(self).model_fields[f].get_default(call_default_factory=True) for f in INT8_ONLY}
        given = [f for f in INT8_ONLY if getattr(self, f) != defaults[f]]
        if self.quantize == "none" and given:
            raise ValueError(
                f"quantize is none, so {', '.join(given)} would change nothing (they say how the int8 "
                "products are made); remove them, or set quantize to int8 or int8_static"
            )
        return self

    @property
    def calls_of(self) -> int:
        """Texts per runtime call: `batch`, or its default for the quantization."""
        return self.batch or (1 if self.quantize == "int8" else 16)


class Export(Family):
    name = "export"
    config = ExportConfig
    trained = False
    built_by = "export"
    compiled = True
    scorer = "reprogate.export.scorer:ExportScorer"
    weights = "model.onnx"
    files = paths.EXPORT_FILES

    def sources(self, spec: Any) -> list[str]:
        return [spec.export.source]

    def references(self, spec: Any, root: Path) -> None:
        name = spec.export.source
        path = root / paths.model_spec(name)
        if not path.is_file():
            raise Refused(("export", "source"), f"export.source names '{name}', but {path} does not exist")
        source = load_spec(path, ModelSpec)
        for m in [name, *source.family_def.sources(source)]:
            built = source if m == name else load_spec(root / paths.model_spec(m), ModelSpec)
            if not built.family_def.exportable:
                within = "" if m == name else f", whose member '{m}' is"
                raise Refused(
                    ("export", "source"),
                    f"export.source '{name}'{within} of family {built.family}, which declares no ONNX "
                    "graph (its family's `onnx`, docs/your-own-model.md); an export compiles a "
                    "classifier whose family declares one (ngram, encoder, an ensemble of those): "
                    "name one of those",
                )
        if source.data != spec.data:
            raise Refused(
                ("data",),
                f"export.source '{name}' uses data '{source.data}' but this export uses '{spec.data}'",
            )
