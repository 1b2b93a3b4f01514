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
# Stage `augment`'s variants of the train partition: read as the split "augmented".
AUGMENTED = Path("data/augmented/train.jsonl")
FEATURES = Path("data/features")
# A language model's corpus as `corpus` canonicalised and split it (train.txt, validation.txt),
# and each model's tokenizer and token ids (`tokenize@m`).
CORPUS = Path("data/corpus")
TOKENS = Path("data/tokens")
MODELS = Path("models")
# What a model folder holds (the train stage's outputs; combine writes the same for an ensemble).
TRAIN_FILES = ("model.safetensors", "config.json", "labels.json", "fingerprint.json", "assets")
LM_FILES = ("model.safetensors", "config.json", "fingerprint.json", "assets")
# An exported model's folder (export@m): one ONNX graph instead of the torch weights.
EXPORT_FILES = ("model.onnx", "config.json", "labels.json", "fingerprint.json", "assets")
WEIGHTS = ("model.safetensors", "model.onnx")
# What calibrate and evaluate read of a classifier's folder beside its weights file (either one).
SCORED_FILES = tuple(f for f in TRAIN_FILES if f not in WEIGHTS)
# An ensemble's nearest-neighbour memory: part of its version, beside its weights.
NEIGHBOUR_MEMORY = Path("assets") / "neighbours.safetensors"


def weights_in(model_dir: Path) -> Path:
    """The weights file a model folder holds (model.safetensors when it holds neither)."""
    return next((model_dir / w for w in WEIGHTS if (model_dir / w).is_file()), model_dir / WEIGHTS[0])


RUNS = Path("runs")
# Headline numbers only (DVC metrics): what `dvc metrics show` and `dvc metrics diff` print.
METRICS = Path("metrics")
# Each stage's complete record, which the next stages, promote and `reprogate report` read:
# tracked by git like metrics/, but not DVC metrics, so a diff shows what moved, not every bin.
RESULTS = Path("results")
PLOTS = Path("plots")
PREDICTIONS = Path("predictions")
# Run telemetry (wall time, throughput, memory): git-ignored and never a DVC output, so a
# reproduction leaves nothing to commit. One JSON Lines file per stage, appended by each run.
LOGS = Path("logs")
DATA_METRICS = METRICS / "data.json"
DATA_RECORD = RESULTS / "data.json"
GATE_METRICS = METRICS / "gate.json"
GATE_DECISION = RESULTS / "gate.json"
# The second pipeline of a project (params.yaml `experiments`): its dvc.yaml, and its gate's files.
EXPERIMENTS = Path("experiments")


def candidate_row(name: str) -> Path:
    """A candidate's row of `dvc metrics show`: its gate verdict and headline numbers."""
    return METRICS / "candidates" / f"{name}.json"


def gate_files(part: str) -> tuple[Path, Path]:
    """(decision, headline) of a pipeline's gate: the default's, or the experiments' own."""
    if part == "default":
        return GATE_DECISION, GATE_METRICS
    return RESULTS / part / "gate.json", METRICS / part / "gate.json"


# The production record (written only by `reprogate promote`, read by the gate and serving).
PRODUCTION = MODELS / "production.json"
# A copy of each promoted model's files (an ensemble's members too), by model version:
# production answers from here after a retrain, and a reverted promotion finds its files.
PROMOTED = MODELS / ".promoted"
# The promoted models' exact files as a DVC remote (`shipped`) committed with the project, so a
# fresh clone answers with production even where it cannot rebuild it bitwise (shipped.py).
SHIPPED = MODELS / "shipped"
# Outside runs/<m>/, which is train@m's persistent output: touching it would rerun train.
RESUME_CHECKS = RUNS / "_resume_check"


def model_spec(name: str) -> Path:
    return MODEL_SPECS / f"{name}.yaml"


def plan_file(name: str) -> Path:
    """specs/models/<m>.plan.yaml: how many updates a budget.train_minutes run trains."""
    return MODEL_SPECS / f"{name}.plan.yaml"


def tokens_dir(name: str) -> Path:
    return TOKENS / name


def model_dir(name: str) -> Path:
    return MODELS / name


def run_dir(name: str) -> Path:
    return RUNS / name


def metrics_dir(name: str) -> Path:
    return METRICS / name


def update_log(run: Path, train_key: str) -> Path:
    """<run folder>/updates/<train key>.jsonl: every update of one training, as it happened."""
    return run / "updates" / f"{train_key}.jsonl"


def results_dir(name: str) -> Path:
    return RESULTS / name


def run_log(stage: str) -> Path:
    """logs/<stage>.jsonl: `train@ngram`, `prepare`, ..."""
    return LOGS / f"{stage}.jsonl"


def plots_dir(name: str) -> Path:
    return PLOTS / name


def prepared_split(split: str) -> Path:
    return AUGMENTED if split == "augmented" else PREPARED / f"{split}.jsonl"


def features_dir(name: str) -> Path:
    return FEATURES / name


def predictions_dir(name: str) -> Path:
    return PREDICTIONS / name


# Each stage's code identity (stage `code`): what DVC compares instead of the source bytes.
CODE = Path("code")


def code_identity(stage: str, family: str | None = None) -> Path:
    """code/<stage>.json; of a stage that runs for each model, one per model family (its name)."""
    return CODE / f"{stage}.json" if family is None else CODE / stage / f"{family}.json"
