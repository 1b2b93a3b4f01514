"""Stage `combine@e`: fit an ensemble's member weights on the calibration partition.

Writes the ensemble's features (members' calibrated log-probabilities for every prepared
split) to data/features/<e>/, and models/<e>/ with the same files as a trained model, so
calibrate@e, evaluate@e and the gate treat it like any other candidate.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from reprogate.errors import UserError, read_json
from reprogate.inference import damaged, separable
from reprogate.models.ensemble import MEMORY, EnsembleCombiner, EnsembleFeaturizer, Neighbours
from reprogate.specs import OOS_LABEL, ModelSpec, load_spec, spec_hash
from reprogate.stages.calibrate import gold_indices
from reprogate.stages.features import prepared_file, splits, write
from reprogate.trainer import read_jsonl


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
    """The neighbour vote's memory: the frozen member's embeddings of the train partition, and of
    the negatives (as out of scope) when the members have an out-of-scope class. Never the
    calibration partition, on which the vote's weight is fitted."""
    embeddings = feat.member_split("train")
    gold = torch.from_numpy(gold_indices(read_jsonl(prepared_file(root, "train")), labels))
    if OOS_LABEL in labels:
        negatives = feat.member_split("negatives")
        embeddings = torch.cat([embeddings, negatives])
        gold = torch.cat([gold, torch.full((len(negatives),), labels.index(OOS_LABEL))])
    return Neighbours.from_features(feat.near, embeddings, gold, len(labels))


def run(root: Path, name: str) -> dict[str, Any]:
    started = time.perf_counter()
    spec_path = root / "specs" / "models" / f"{name}.yaml"
    spec = load_spec(spec_path, ModelSpec)
    members = spec.ensemble.members
    for m in members:
        if not (root / "models" / m / "calibration.json").is_file():
            raise UserError(
                f"{spec_path}: ensemble member '{m}' has no calibrated model in models/{m}; run "
                f"`dvc repro calibrate@{m}` (which trains it first if needed), then combine again."
            )
    labels = [read_json(root / "models" / m / "labels.json", damaged(root / "models" / m)) for m in members]
    if any(lbl != labels[0] for lbl in labels):
        raise UserError(
            f"{spec_path}: ensemble.members {members} have different output labels; retrain them "
            "on the same data spec with the same head.out_of_scope_class."
        )
    feat = EnsembleFeaturizer(root, members, spec.ensemble.neighbours)
    if feat.near:
        feat.neighbours = neighbours_memory(root, feat, labels[0])
    cached: dict[str, torch.Tensor] = {}

    def score(split: str):
        cached[split] = feat.split(split)
        return cached[split], {}

    write(root, name, feat, splits(root, spec), score)

    gold = torch.from_numpy(gold_indices(read_jsonl(prepared_file(root, "calibration")), labels[0]))
    parts = feat.parts()
    model, fitted = fit_weights(cached["calibration"], gold, len(parts))
    with torch.no_grad():
        nll = float(torch.nn.functional.cross_entropy(model(cached["calibration"]), gold))
        vgold = gold_indices(read_jsonl(prepared_file(root, "validation")), labels[0])
        val_acc = float((model(cached["validation"]).argmax(-1).numpy() == vgold).mean())
        member_acc = {
            m: float((cached["validation"][:, i].argmax(-1).numpy() == vgold).mean())
            for i, m in enumerate(parts)
        }
    weights = {m: float(w) for m, w in zip(parts, model.weights().detach(), strict=True)}

    model_dir = root / "models" / name
    model_dir.mkdir(parents=True, exist_ok=True)
    for f in ("model.safetensors", "config.json", "labels.json", "fingerprint.json", "assets"):
        p = model_dir / f
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    (model_dir / "assets").mkdir()
    (model_dir / "assets" / "members.json").write_text(json.dumps(feat.key(), indent=2) + "\n")
    if feat.neighbours is not None:
        feat.neighbours.save(model_dir / MEMORY)
    save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()},
        str(model_dir / "model.safetensors"),
    )
    config = {
        "family": "ensemble",
        "n_out": len(labels[0]),
        "featurizer": feat.key(),
        "spec": spec.model_dump(mode="json"),
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (model_dir / "labels.json").write_text(json.dumps(labels[0], indent=1, ensure_ascii=False) + "\n")
    fingerprint = {"spec_hash": spec_hash(spec), "members": feat.key()["members"]}
    (model_dir / "fingerprint.json").write_text(json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")
    metrics = {
        "members": members,
        "weights": weights,
        "calibration_nll": nll,
        "validation_accuracy": val_acc,
        "member_validation_accuracy": member_acc,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    if not fitted:
        metrics["weights_note"] = (
            f"the members' combination got all {len(gold)} calibration queries right, so they cannot "
            "say how sharp the ensemble should be: weights rescaled to sum to 1; add calibration "
            f"data (split.calibration in {spec.data})"
        )
    (root / "metrics" / name).mkdir(parents=True, exist_ok=True)
    (root / "metrics" / name / "train.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def summary(name: str, m: dict[str, Any]) -> str:
    w = ", ".join(f"{k} {v:.3f}" for k, v in m["weights"].items())
    members = ", ".join(f"{k} {v:.4f}" for k, v in m["member_validation_accuracy"].items())
    line = (
        f"combine: {name}: weights {w}; validation accuracy {m['validation_accuracy']:.4f} "
        f"(members: {members}) in {m['wall_s']:.1f} s"
    )
    return "; ".join([line, m["weights_note"]]) if "weights_note" in m else line
