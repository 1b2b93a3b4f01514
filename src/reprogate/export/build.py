"""What stage `export@m` runs: the source candidate as models/<m>/model.onnx, every prepared
split it is judged on scored by the exported runtime (data/features/<m>/, its logits), and how
far it strays from its source (metrics/<m>/export.json).

calibrate@m and evaluate@m then read those logits like any candidate's features: the numbers the
gate judges are the exported runtime's, computed with the threads and batches it serves with.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import time
from pathlib import Path

import numpy as np
import torch

from reprogate.data.prepared import splits, texts, write_features
from reprogate.export.graph import Input, build_graph
from reprogate.export.onnx_file import to_onnx
from reprogate.export.runtime import INPUTS, ONNX
from reprogate.export.scorer import ExportScorer
from reprogate.folder.files import clear, model_version
from reprogate.folder.scorer import Scorer
from reprogate.records.base import write
from reprogate.records.export import Agreement, ExportRecord
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.specs.base import spec_hash
from reprogate.specs.families.export import INT8_ONLY, STATIC_SAMPLE
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.hashing import sha256_file

# What calibrate@m and evaluate@m never read of a model: the training data.
UNJUDGED = ("train", "negatives")
COMPARED = ("validation", "test")


def versions() -> dict[str, str]:
    return {p: md.version(p) for p in ("onnxruntime", "onnx", "torch")}


def _assets(out: Path, inputs: list[Input]) -> None:
    """assets/inputs.json and the files each member's preprocessing reads (a tokenizer)."""
    assets = out / "assets"
    for spec in inputs:
        for name, data in spec.files.items():
            (assets / spec.member).mkdir(exist_ok=True)
            (assets / spec.member / name).write_bytes(data)
    inputs_json = [{"member": i.member, "kind": i.kind, "config": i.config} for i in inputs]
    (out / INPUTS).write_text(json.dumps(inputs_json, indent=2) + "\n")


def static_sample(root: Path, spec: ModelSpec) -> list[str] | None:
    """The train texts an int8_static export fixes its activation ranges on: a sample seeded by
    the spec's seed, never a set the candidate is judged or calibrated on."""
    if spec.export is None or spec.export.quantize != "int8_static":
        return None
    train = texts(root, "train")
    rng = np.random.default_rng(spec.seed)
    picked = rng.choice(len(train), min(STATIC_SAMPLE, len(train)), replace=False)
    return [train[i] for i in sorted(picked)]


def write_folder(root: Path, name: str, spec: ModelSpec, source: Scorer) -> None:
    """models/<name>/: model.onnx, its inputs and tokenizers, labels, config, fingerprint."""
    out = root / paths.model_dir(name)
    clear(out)  # a model folder's files; model.onnx is written whole below
    graph, inputs = build_graph(source)
    _assets(out, inputs)
    to_onnx(graph, inputs, out / ONNX, spec.export, static_sample(root, spec))
    (out / "labels.json").write_text(json.dumps(source.labels, indent=1, ensure_ascii=False) + "\n")
    key = {
        "family": "export",
        "source": source.name,
        "source_version": model_version(source.files),
        "export": spec.export.model_dump(mode="json"),
        "runtime": versions(),
        "onnx_sha256": sha256_file(out / ONNX),
    }
    config = ModelConfig(
        family="export", n_out=len(source.labels), featurizer=key, spec=spec.model_dump(mode="json")
    )
    write(out / "config.json", config)
    write(out / "fingerprint.json", Fingerprint(spec_hash=spec_hash(spec), environment=versions()))


def agreement(ours: torch.Tensor, theirs: torch.Tensor) -> Agreement:
    agree = int((ours.argmax(1) == theirs.argmax(1)).sum())
    diff = float((ours - theirs).abs().max()) if len(ours) else 0.0
    return Agreement(n=len(ours), agree=agree, share=agree / max(len(ours), 1), max_abs_logit_diff=diff)


def export(root: Path, name: str, log=print) -> ExportRecord:
    spec = load_spec(root / paths.model_spec(name), ModelSpec)
    assert spec.export is not None
    torch.set_num_threads(spec.threads)
    started = time.perf_counter()
    source = Scorer(root, spec.export.source, device="cpu")
    write_folder(root, name, spec, source)
    log(f"export: {name}: {spec.export.source} -> {ONNX} in {time.perf_counter() - started:.0f} s")
    scorer = ExportScorer(root, name)
    scored: dict[str, torch.Tensor] = {}

    def score(split: str):
        scored[split] = scorer.featurizer.encode(texts(root, split))
        return scored[split], {}

    judged = [s for s in splits(root, spec) if s not in UNJUDGED]
    write_features(root, name, scorer.featurizer, judged, score)
    identity = scorer.featurizer.key()  # written by write_folder: the source's hashes, not redone
    record = ExportRecord(
        source=source.name,
        source_version=identity["source_version"],
        format=spec.export.format,
        quantize=spec.export.quantize,
        **({} if spec.export.quantize == "none" else spec.export.model_dump(include=set(INT8_ONLY))),
        opset=spec.export.opset,
        runtime=identity["runtime"],
        file_bytes=(root / paths.model_dir(name) / ONNX).stat().st_size,
        agreement={s: agreement(scored[s], source.split_logits(s)) for s in COMPARED if s in scored},
    )
    write(root / paths.metrics_dir(name) / "export.json", record)
    return record


def summary(name: str, r: ExportRecord) -> str:
    agree = ", ".join(f"{s} {a.share:.2%} ({a.n - a.agree} differ)" for s, a in r.agreement.items())
    return (
        f"export: {name}: {r.source} as ONNX ({r.quantize}, {r.file_bytes / 1e6:.1f} MB); "
        f"agrees with its source on {agree}"
    )
