"""Every path the project reads or writes, relative to its root, named once.

Stages, the gate, promotion and serving all find files through these, so a folder moves in
one place, and a reader never guesses the writer's layout.
"""

from __future__ import annotations

from pathlib import Path

PARAMS = Path("params.yaml")
DVC_YAML = Path("dvc.yaml")
SPECS = Path("specs")
MODEL_SPECS = SPECS / "models"
RAW = Path("data/raw")
PREPARED = Path("data/prepared")
FEATURES = Path("data/features")
MODELS = Path("models")
RUNS = Path("runs")
METRICS = Path("metrics")
PLOTS = Path("plots")
PREDICTIONS = Path("predictions")
DATA_METRICS = METRICS / "data.json"
GATE_DECISION = METRICS / "gate.json"
# The production record (written only by `reprogate promote`, read by the gate and serving).
PRODUCTION = MODELS / "production.json"
# A copy of each promoted model's files (an ensemble's members too), by model version:
# production answers from here after a retrain, and a reverted promotion finds its files.
PROMOTED = MODELS / ".promoted"
# Outside runs/<m>/, which is train@m's persistent output: touching it would rerun train.
RESUME_CHECKS = RUNS / "_resume_check"


def model_spec(name: str) -> Path:
    return MODEL_SPECS / f"{name}.yaml"


def model_dir(name: str) -> Path:
    return MODELS / name


def run_dir(name: str) -> Path:
    return RUNS / name


def metrics_dir(name: str) -> Path:
    return METRICS / name


def plots_dir(name: str) -> Path:
    return PLOTS / name


def prepared_split(split: str) -> Path:
    return PREPARED / f"{split}.jsonl"


def features_dir(name: str) -> Path:
    return FEATURES / name


def predictions_dir(name: str) -> Path:
    return PREDICTIONS / name
