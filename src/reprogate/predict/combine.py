"""What stage `combine@m` runs: an ensemble's member weights fitted on validation, its
neighbour memory, its model folder (pipeline/stages/combine.py declares it to DVC)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from reprogate.data.prepared import gold_indices, rows, splits, write_features
from reprogate.folder.files import clear, damaged, write_folder
from reprogate.folder.scorer import Scorer
from reprogate.models.ensemble import EnsembleCombiner, EnsembleFeaturizer, Neighbours
from reprogate.predict.calibration import separable
from reprogate.records.base import write
from reprogate.records.train import CombineRecord, Fingerprint, ModelConfig
from reprogate.specs.base import OOS_LABEL, spec_hash
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.errors import UserError, read_json


def export_ensemble(
    out: Path, spec: ModelSpec, model: torch.nn.Module, feat: EnsembleFeaturizer, labels: list[str]
) -> None:
    """models/<e>/ of a combined ensemble: the same files as a trained model, so calibrate,
    evaluate and the gate treat it like any other candidate."""
    assets = clear(out)
    (assets / "members.json").write_text(json.dumps(feat.key(), indent=2) + "\n")
    if feat.neighbours is not None:
        feat.neighbours.save(out / paths.NEIGHBOUR_MEMORY)
    config = ModelConfig(
        family=spec.family, n_out=len(labels), featurizer=feat.key(), spec=spec.model_dump(mode="json")
    )
    fingerprint = Fingerprint(spec_hash=spec_hash(spec), members=feat.key()["members"])
    write_folder(out, model, config, labels, fingerprint)


def fit_weights(logp: torch.Tensor, gold: torch.Tensor, k: int) -> tuple[EnsembleCombiner, bool]:
    """Weights minimising the calibration NLL, and whether they could be fitted. When the fitted
    combination gets every calibration row right, scaling it up keeps lowering the NLL: there is
    no minimum. The direction still says which members separate the classes (it tends to the
    largest-margin one), the scale says nothing, so the weights are rescaled to sum to 1."""
    torch.manual_seed(0)
    model = EnsembleCombiner(k)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(logp), gold)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        if not separable(model(logp), gold):
            return model, True
        model.log_w -= torch.logsumexp(model.log_w, 0)
    return model, False


def neighbours_memory(root: Path, feat: EnsembleFeaturizer, labels: list[str]) -> Neighbours:
    """The neighbour vote's memory: the frozen member's embeddings of the train partition, of its
    augmented variants when neighbours.augmented says so (encoded here: the member's features
    cover them only if it trained on them), and of the negatives (as out of scope) when the
    members have an out-of-scope class. Never the calibration partition, on which the vote's
    weight is fitted."""
    assert feat.near is not None
    embeddings = feat.member_split("train")
    gold = torch.from_numpy(gold_indices(rows(root, "train"), labels))
    if feat.near.augmented:
        variants = rows(root, "augmented")
        embeddings = torch.cat([embeddings, feat.encode_near([r["text"] for r in variants])])
        gold = torch.cat([gold, torch.from_numpy(gold_indices(variants, labels))])
    if OOS_LABEL in labels:
        negatives = feat.member_split("negatives")
        embeddings = torch.cat([embeddings, negatives])
        gold = torch.cat([gold, torch.full((len(negatives),), labels.index(OOS_LABEL))])
    return Neighbours.from_features(feat.near, embeddings, gold, len(labels))


def _members(root: Path, spec_path: Path, spec: ModelSpec) -> tuple[EnsembleFeaturizer, list[str]]:
    """The ensemble's featurizer over its calibrated members in models/, and their output labels."""
    members = spec.ensemble.members
    for m in members:
        if not (root / paths.model_dir(m) / "calibration.json").is_file():
            raise UserError(
                f"{spec_path}: ensemble member '{m}' has no calibrated model in models/{m}; run "
                f"`dvc repro calibrate@{m}` (which trains it first if needed), then combine again."
            )
    labels = [
        read_json(root / paths.model_dir(m) / "labels.json", damaged(root / paths.model_dir(m)))
        for m in members
    ]
    if any(lbl != labels[0] for lbl in labels):
        raise UserError(
            f"{spec_path}: ensemble.members {members} have different output labels; retrain them "
            "on the same data spec with the same head.out_of_scope_class."
        )
    feat = EnsembleFeaturizer(members, spec.ensemble.neighbours, root / paths.MODELS)
    feat.load_members = lambda: [Scorer(root, m) for m in members]
    if feat.near:
        feat.neighbours = neighbours_memory(root, feat, labels[0])
    return feat, labels[0]


def combine(root: Path, name: str) -> dict[str, Any]:
    started = time.perf_counter()
    spec_path = root / paths.model_spec(name)
    spec = load_spec(spec_path, ModelSpec)
    feat, labels = _members(root, spec_path, spec)
    cached: dict[str, torch.Tensor] = {}

    def score(split: str):
        cached[split] = feat.split(split)
        return cached[split], {}

    write_features(root, name, feat, splits(root, spec), score)

    gold = torch.from_numpy(gold_indices(rows(root, "calibration"), labels))
    parts = feat.parts()
    model, fitted = fit_weights(cached["calibration"], gold, len(parts))
    with torch.no_grad():
        nll = float(torch.nn.functional.cross_entropy(model(cached["calibration"]), gold))
        vgold = gold_indices(rows(root, "validation"), labels)
        val_acc = float((model(cached["validation"]).argmax(-1).numpy() == vgold).mean())
        member_acc = {
            m: float((cached["validation"][:, i].argmax(-1).numpy() == vgold).mean())
            for i, m in enumerate(parts)
        }
    export_ensemble(root / paths.model_dir(name), spec, model, feat, labels)
    unfitted = {
        "weights_note": f"the members' combination got all {len(gold)} calibration queries right, so they "
        "cannot say how sharp the ensemble should be: weights rescaled to sum to 1; add calibration "
        f"data (split.calibration in {spec.data})"
    }
    record = CombineRecord(
        weights={m: float(w) for m, w in zip(parts, model.weights().detach(), strict=True)},
        calibration_nll=nll,
        validation_accuracy=val_acc,
        member_validation_accuracy=member_acc,
        **({} if fitted else unfitted),
    )
    write(root / paths.metrics_dir(name) / "train.json", record)
    return {**record.model_dump(mode="json", exclude_unset=True), "wall_s": time.perf_counter() - started}


def summary(name: str, m: dict[str, Any]) -> str:
    w = ", ".join(f"{k} {v:.3f}" for k, v in m["weights"].items())
    members = ", ".join(f"{k} {v:.4f}" for k, v in m["member_validation_accuracy"].items())
    line = (
        f"combine: {name}: weights {w}; validation accuracy {m['validation_accuracy']:.4f} "
        f"(members: {members}) in {m['wall_s']:.1f} s"
    )
    return "; ".join([line, m["weights_note"]]) if "weights_note" in m else line
