"""What export@m writes beside the exported model: metrics/<m>/export.json."""

from __future__ import annotations

from typing import Literal

from reprogate.records.base import Record


class Agreement(Record):
    """The exported runtime against its source on one prepared split."""

    n: int
    agree: int  # items whose top intent is the source's
    share: float
    max_abs_logit_diff: float  # of the raw logits, before either model's calibration


class ExportRecord(Record):
    source: str
    source_version: str  # NAME@<12 hex> of the source's weights (and members')
    format: Literal["onnx"]
    quantize: Literal["none", "int8", "int8_static"]
    # How the products were quantized (the export spec's fields; None for a float32 graph)
    per_channel: bool | None = None
    reduce_range: bool | None = None
    float_after: list[str] = []
    opset: int
    runtime: dict[str, str]  # onnxruntime, onnx and torch versions that built and scored it
    file_bytes: int  # model.onnx
    agreement: dict[str, Agreement]  # per split: validation and the held-out test
