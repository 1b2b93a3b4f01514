"""model.onnx from a Graph: torch.onnx's exporter, then, as the spec says, ONNX Runtime's
dynamic int8 quantization of the matrix products.

Both steps are deterministic for the same inputs and package versions (requirements.lock pins
them): the exporter traces the same program, and quantization derives every scale from the
weights alone. The neighbour vote's memory stays float: quantizing the similarities would move
which neighbours are nearest, and it is a lookup, not where the time goes.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path

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


def to_onnx(graph: Graph, inputs: list[Input], out: Path, config: ExportConfig) -> None:
    """Write the graph to `out` as float32 ONNX, then quantized when the spec asks."""
    names = [n for spec in inputs for n in spec.names()]
    dims = tuple({0: "batch", 1: f"{spec.member}_length"} for spec in inputs for _ in range(2))
    with tempfile.TemporaryDirectory(prefix="reprogate-onnx-") as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        quiet = logging.getLogger("torch.onnx")  # "torchvision is not installed", per operator
        level, quiet.level = quiet.level, logging.ERROR
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
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
        quiet.setLevel(level)
        _strip_shapes(fp32)
        if config.quantize == "none":
            out.write_bytes(fp32.read_bytes())
        else:
            _quantize(fp32, out, config)


def _strip_shapes(path: Path) -> None:
    """Drop the exporter's intermediate shape annotations: ONNX's shape inference, which the
    quantizer runs, recomputes them and refuses some of the exporter's (a transposed weight)."""
    import onnx

    model = onnx.load(str(path))
    del model.graph.value_info[:]
    onnx.save(model, str(path))


def _quantize(fp32: Path, out: Path, config: ExportConfig) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(fp32))
    # The heads stay float too: a small share of the time, and their error lands on the logits.
    floats = {i.name for i in model.graph.initializer if i.name.endswith("memory_t") or ".head." in i.name}
    after = {o for n in model.graph.node if n.op_type in config.float_after for o in n.output}
    keep = [
        n.name
        for n in model.graph.node
        if n.op_type in ("MatMul", "Gemm") and set(n.input) & (floats | after)
    ]
    # The dynamic quantizer first rewrites each Gemm as <name>_MatMul and <name>_Add.
    keep_float = [*keep, *(f"{n}_MatMul" for n in keep)]
    quantize_dynamic(
        str(fp32),
        str(out),
        weight_type=QuantType.QInt8,
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        op_types_to_quantize=["MatMul", "Gemm"],
        nodes_to_exclude=keep_float,
    )
