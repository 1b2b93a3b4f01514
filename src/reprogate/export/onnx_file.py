"""model.onnx from a Graph: torch.onnx's exporter, then, as the spec says, ONNX Runtime's
int8 quantization of the matrix products, dynamic or static.

Both steps are deterministic for the same inputs and package versions (requirements.lock pins
them): the exporter traces the same program; dynamic quantization derives every scale from the
weights alone, static from the weights and the float graph's ranges on a fixed train sample.
The neighbour vote's memory stays float: quantizing the similarities would move
which neighbours are nearest, and it is a lookup, not where the time goes.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from reprogate.export.graph import Graph, Input
from reprogate.specs.families.export import ExportConfig

# Example sizes, all distinct and above 1, so the exporter keeps every dimension symbolic.
BATCH, LENGTHS = 3, (11, 17, 23, 29)


def example(inputs: list[Input]) -> tuple[torch.Tensor, ...]:
    xs: list[torch.Tensor] = []
    for i, spec in enumerate(inputs):
        width = LENGTHS[i % len(LENGTHS)]
        ids = torch.ones((BATCH, width), dtype=torch.long)
        mask = torch.ones((BATCH, width), dtype=torch.long if spec.kind == "tokens" else torch.float32)
        xs += [ids, mask]
    return tuple(xs)


def to_onnx(
    graph: Graph, inputs: list[Input], out: Path, config: ExportConfig, sample: list[str] | None = None
) -> None:
    """Write the graph to `out` as float32 ONNX, then quantized when the spec asks (int8_static
    fixes its activation ranges on `sample`, texts of the train partition)."""
    names = [n for spec in inputs for n in spec.names()]
    dims = tuple({0: "batch", 1: f"{spec.member}_length"} for spec in inputs for _ in range(2))
    with tempfile.TemporaryDirectory(prefix="reprogate-onnx-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        # "torchvision is not installed", per operator
        with _quiet("torch.onnx"), warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's deprecation chatter, not the user's
            torch.onnx.export(
                graph,
                example(inputs),
                str(fp32),
                dynamo=True,
                input_names=names,
                output_names=["logits"],
                dynamic_shapes={"xs": dims},
                opset_version=config.opset,
                external_data=False,
                verbose=False,
            )
        _strip_annotations(fp32)
        if config.quantize == "none":
            out.write_bytes(fp32.read_bytes())
        elif config.quantize == "int8_static":
            _quantize_static(fp32, out, config, sample_feeds(inputs, sample or [], config.calls_of))
        else:
            _quantize(fp32, out, config)


@contextlib.contextmanager
def _quiet(logger: str | None):
    """A library's logger (None: the root one) at ERROR while the block runs, as it was after."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _strip_annotations(path: Path) -> None:
    """Drop the exporter's intermediate shape annotations: ONNX's shape inference, which the
    quantizer runs, recomputes them and refuses some of the exporter's (a transposed weight).
    Drop its per-node metadata too: each node's Python stack trace, with the absolute path and
    line numbers of the code that traced it, so the bytes would change with the project's folder
    and with a comment above a traced line, neither of which changes what the graph computes."""
    import onnx

    model = onnx.load(str(path))
    del model.graph.value_info[:]
    graphs = [model.graph]
    while graphs:
        for node in graphs.pop().node:
            del node.metadata_props[:]
            graphs += [a.g for a in node.attribute if a.HasField("g")]
            graphs += [g for a in node.attribute for g in a.graphs]
    onnx.save(model, str(path))


def _kept_float(model, config: ExportConfig, weights_only: bool) -> list[str]:
    """The matrix products that stay float32: the heads' and the neighbour memory's (a small
    share of the time, and their error lands on the logits), those fed by config.float_after's
    operators, and with `weights_only` every product of two activations (attention's), which
    the dynamic quantizer leaves float by itself."""
    initializers = {i.name for i in model.graph.initializer}
    floats = {i for i in initializers if i.endswith("memory_t") or ".head." in i}
    after = {o for n in model.graph.node if n.op_type in config.float_after for o in n.output}
    keep = [
        n.name
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm")
        and (set(n.input) & (floats | after) or (weights_only and not set(n.input) & initializers))
    ]
    # The dynamic quantizer first rewrites each Gemm as <name>_MatMul and <name>_Add.
    return [*keep, *(f"{n}_MatMul" for n in keep)]


def sample_feeds(inputs: list[Input], sample: list[str], batch: int) -> list[dict[str, np.ndarray]]:
    """The graph's inputs for the sample texts, in the calls the runtime would make."""
    from reprogate.export.runtime import Preprocess, batches

    if not sample:
        raise ValueError("int8_static needs sample texts to fix its activation ranges")
    members = [Preprocess.of_input(i.member, i.kind, i.config, i.files) for i in inputs]
    return [feed for _, feed in batches(members, sample, batch)]


def _quantize_static(fp32: Path, out: Path, config: ExportConfig, feeds: list[dict[str, np.ndarray]]) -> None:
    """int8 weights and activations, each activation's range fixed once from the minimum and
    maximum the float graph reaches on `feeds` (ONNX Runtime's MinMax calibration), so a text's
    quantization never depends on what it is batched with."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Sample(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    with _quiet(None):  # the root logger's "consider pre-processing": shape inference already ran
        quantize_static(
            str(fp32),
            str(out),
            Sample(),
            # QOperator: int8 weights stored as such; QDQ's DequantizeLinear of each weight would
            # fold to float at load (and is refused by export/runtime.declared_bytes).
            quant_format=QuantFormat.QOperator,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=config.per_channel,
            reduce_range=config.reduce_range,
            op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_exclude=_kept_float(onnx.load(str(fp32)), config, weights_only=True),
            calibrate_method=CalibrationMethod.MinMax,
        )


def _quantize(fp32: Path, out: Path, config: ExportConfig) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep_float = _kept_float(onnx.load(str(fp32)), config, weights_only=False)
    quantize_dynamic(
        str(fp32),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        op_types_to_quantize=["MatMul", "Gemm"],
        nodes_to_exclude=keep_float,
    )
