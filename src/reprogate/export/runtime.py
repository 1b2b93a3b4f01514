"""An exported model folder answered by ONNX Runtime: texts in, the source's logits out.

No torch here: a server of an exported model needs onnxruntime, tokenizers and numpy. The
members' preprocessing (assets/inputs.json) is repeated exactly as the torch featurizers do it:
the same tokenizer file with the same truncation (the closing [SEP] kept), the same n-gram
hashing. Texts are scored in batches sorted by length, so padding stays small, and come back
in their input order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from reprogate.folder.manifest import Files
from reprogate.utils.errors import UserError
from reprogate.utils.ngrams import ngram_ids
from reprogate.utils.text import canonical

INPUTS = Path("assets") / "inputs.json"
ONNX = "model.onnx"


def session_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Threads that spin after a call keep a core busy: in a server, the tokenizing and HTTP
    # threads need it back (measured: docs/benchmarks.md).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def padded(rows: list[list[int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), dtype)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


class Preprocess:
    """One member's inputs from texts."""

    def __init__(self, member: str, kind: str, cfg: dict, tokenizer_json: str | None = None):
        self.member, self.kind = member, kind
        if kind == "tokens":
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_str(tokenizer_json or "")
            self.tokenizer.no_padding()
            self.tokenizer.enable_truncation(cfg["max_length"])
        else:
            self.grams = (tuple(cfg["word_ngrams"]), tuple(cfg["char_ngrams"]), cfg["buckets"])

    @classmethod
    def of_input(cls, member: str, kind: str, config: dict, files: dict[str, bytes]) -> Preprocess:
        """A member's preprocessing from what the exporter declares (export/graph.Input)."""
        tokenizer = files.get("tokenizer.json")
        return cls(member, kind, config, tokenizer.decode("utf-8") if tokenizer is not None else None)

    @classmethod
    def of(cls, files: Files, spec: dict) -> Preprocess:
        """A member's preprocessing as assets/inputs.json of an export folder declares it."""
        tokenizer = f"assets/{spec['member']}/tokenizer.json"
        text = files.bytes(tokenizer).decode("utf-8") if spec["kind"] == "tokens" else None
        return cls(spec["member"], spec["kind"], spec["config"], text)

    def rows(self, texts: list[str]) -> list[list[int]]:
        if self.kind == "tokens":
            return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=True)]
        return [ngram_ids(t, *self.grams) for t in texts]

    def feed(self, rows: list[list[int]]) -> dict[str, np.ndarray]:
        ids, mask = padded(rows, np.int64 if self.kind == "tokens" else np.float32)
        return {f"{self.member}.ids": ids, f"{self.member}.mask": mask}


def batches(members: list[Preprocess], texts: list[str], batch: int):
    """(row indices, the graph's inputs) per call: the canonical texts sorted by length, so
    padding stays small, `batch` at a time."""
    texts = [canonical(t) for t in texts]
    rows = [m.rows(texts) for m in members]
    order = sorted(range(len(texts)), key=lambda i: sum(len(r[i]) for r in rows))
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        feed: dict[str, np.ndarray] = {}
        for m, r in zip(members, rows, strict=True):
            feed |= m.feed([r[i] for i in idx])
        yield idx, feed


def declared_bytes(graph_bytes: bytes) -> int:
    """The bytes a model.onnx makes ONNX Runtime allocate when it loads: its tensors
    (initializers and constants) and what the nodes computing only from constants produce,
    which the runtime folds at load (a 200-byte ConstantOfShape can ask for terabytes). From the
    protobuf and ONNX's own shape inference alone. An export stores every tensor inside the
    file, densely, so a graph whose tensors are sparse or stored elsewhere, or whose folded
    constants have no known size, is refused (ValueError): it is none that `export` writes."""
    import onnx

    model = onnx.load_model_from_string(graph_bytes)  # external data is never followed from bytes
    graph = model.graph
    total = sum(_tensor_bytes(t) for t in _tensors(graph))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
    known = {v.name: v.type.tensor_type for v in [*inferred.value_info, *inferred.output]}
    constant = {t.name for t in graph.initializer}
    for node in inferred.node:
        if node.op_type == "Constant" or not node.input:
            constant.update(node.output)
            continue
        if all(not name or name in constant for name in node.input):
            constant.update(node.output)
            for out in node.output:
                total += _folded_bytes(out, known.get(out))
    return total


def _tensors(graph) -> list:
    """Every dense tensor stored in the graph and its subgraphs; ValueError for any other."""
    import onnx

    if graph.sparse_initializer:
        raise ValueError("it holds sparse tensors, which no export writes")
    out, todo = list(graph.initializer), [*graph.node]
    while todo:
        for attr in todo.pop().attribute:
            if attr.HasField("sparse_tensor") or attr.sparse_tensors:
                raise ValueError("it holds sparse tensors, which no export writes")
            out += ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                out += _tensors(sub)
    for t in out:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"tensor {t.name!r} is stored outside the file, which no export does")
    return out


def _itemsize(data_type: int) -> int:
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(data_type).itemsize if data_type else 1


def _tensor_bytes(t) -> int:
    if any(d < 0 for d in t.dims):
        raise ValueError(f"tensor {t.name!r} has a negative dimension {list(t.dims)}")
    return math.prod(t.dims) * _itemsize(t.data_type)


def _folded_bytes(name: str, tensor_type) -> int:
    dims = (
        [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
        if tensor_type
        else [-1]
    )
    if tensor_type is None or not tensor_type.HasField("shape") or any(d < 0 for d in dims):
        raise ValueError(f"{name!r} is computed from constants at load, to a size the graph does not fix")
    return math.prod(dims) * _itemsize(tensor_type.elem_type)


# Beyond this share of the file's own size, the tensors it declares cannot be in it.
DECLARED_SLACK = 1.05


class Runtime:
    """models/<m>/model.onnx in an ONNX Runtime session on `threads` CPU threads."""

    def __init__(self, files: Files, threads: int, batch: int = 64):
        """`files`: the export's folder as read (folder/manifest.py); the session loads the very
        bytes a promotion's pins were checked on."""
        import onnxruntime as ort

        folder, self.batch = files.dir, batch
        try:
            inputs = json.loads(files.bytes(INPUTS.as_posix()))
            graph = files.bytes(ONNX)
            if (declared := declared_bytes(graph)) > len(graph) * DECLARED_SLACK + 4096:
                raise ValueError(
                    f"it declares {declared:,} bytes of tensors but is {len(graph):,} bytes long, so "
                    "its tensors are not in it; loading it would allocate them"
                )
            self.session = ort.InferenceSession(
                graph, session_options(threads), providers=["CPUExecutionProvider"]
            )
        except (OSError, ValueError, KeyError, RuntimeError, UserError, DecodeError) as e:
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(
                f"{folder / ONNX}: the exported model cannot be loaded ({said}); `dvc checkout {folder}` "
                "restores what DVC cached, or `dvc repro` exports it again."
            ) from None
        try:
            self.members = [Preprocess.of(files, spec) for spec in inputs]
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
            said = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise UserError(
                f"{folder / INPUTS.parent}: a member's preprocessing cannot be read ({said}); "
                f"`dvc checkout {folder}` restores what DVC cached, or `dvc repro` exports it again."
            ) from None
        self.output = self.session.get_outputs()[0].name

    def logits(self, texts: list[str]) -> np.ndarray:
        """[len(texts), classes] float32 logits of the canonical form of each text."""
        out: np.ndarray | None = None
        for idx, feed in batches(self.members, texts, self.batch):
            got = self.session.run([self.output], feed)[0]
            if out is None:
                out = np.empty((len(texts), got.shape[1]), np.float32)
            out[idx] = got
        return out if out is not None else np.zeros((0, 0), np.float32)
