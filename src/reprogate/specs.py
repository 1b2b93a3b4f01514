"""Every spec kind in one place: pydantic v2 models, cross-field rules, loading and hashing.

Specs are strict: unknown keys are errors, and a string is never coerced into a number.
Relative paths inside a spec are relative to the project root (the nearest folder above
the spec holding `params.yaml` or `.dvc`), so a spec means the same from any working dir.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reprogate.errors import UserError, format_validation_error

# The name of a model's own out-of-scope output (head.out_of_scope_class): no intent may use it.
OOS_LABEL = "out_of_scope"

Sha256 = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{64}$"),
    Field(description="sha256 of the raw file: 64 lowercase hex digits (`sha256sum FILE`)."),
]
Commit = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{40}$"),
    Field(description="An immutable revision: a full 40-hex-digit commit id, never a branch."),
]
Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]
PosInt = Annotated[int, Field(ge=1)]
Pair = Annotated[list[PosInt], Field(min_length=2, max_length=2)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- data specs


class UrlSource(Strict):
    kind: Literal["url"]
    url: str = Field(
        description="URL template with {revision} and {file}, e.g. "
        "https://raw.githubusercontent.com/OWNER/REPO/{revision}/folder/{file}"
    )
    revision: Commit

    @field_validator("url")
    @classmethod
    def _pinned(cls, v: str) -> str:
        if "{revision}" not in v or "{file}" not in v:
            raise ValueError(
                "the URL must contain the placeholders {revision} and {file} so that every "
                "download is pinned to the spec's revision; e.g. "
                "https://raw.githubusercontent.com/OWNER/REPO/{revision}/data/{file}"
            )
        return v


class HfSource(Strict):
    kind: Literal["hf"]
    repo: str = Field(
        pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$",
        description="Hugging Face hub dataset repo as owner/name, e.g. PolyAI/banking77.",
    )
    revision: Commit


class LocalSource(Strict):
    kind: Literal["local"]
    path: str = Field(description="Folder holding the raw files, relative to the project root.")


Source = Annotated[UrlSource | HfSource | LocalSource, Field(discriminator="kind")]


class Origin(Strict):
    """A pinned set of raw files: where they come from and the sha256 of each."""

    source: Source
    files: dict[str, Sha256] = Field(
        min_length=1, description="Raw file name (path inside the source) -> its sha256."
    )


class Table(Strict):
    """How to read (text, label) rows out of one raw file."""

    origin: str = Field(description="Key of `origins` this file comes from.")
    file: str = Field(description="File name, one of that origin's `files`.")
    format: Literal["csv", "jsonl", "clinc_json"] = "csv"
    text_field: str = Field("text", description="Column (csv) or key (jsonl) holding the text.")
    label_field: str = Field("label", description="Column (csv) or key (jsonl) of the label.")
    keys: list[str] = Field(
        default_factory=list,
        description="clinc_json only: which top-level lists to read, e.g. [oos_test].",
    )
    exclude_labels: list[str] = Field(
        default_factory=list, description="Rows with these source labels are left out on purpose."
    )


class EvalSet(Strict):
    table: Table
    kind: Literal["out_of_scope", "labelled"] = Field(
        description="out_of_scope: no item has an intent (the model should not act); "
        "labelled: real utterances whose labels must be in the vocabulary."
    )
    use: Literal["evaluate", "calibrate"] = Field(
        "evaluate",
        description="calibrate: may be used to fit the routing policy; evaluate: never seen "
        "before evaluation.",
    )


class SplitPolicy(Strict):
    seed: int = 0
    validation: Fraction = 0.1
    calibration: Fraction = 0.1
    stratify: bool = True

    @model_validator(mode="after")
    def _train_left(self) -> SplitPolicy:
        if self.validation + self.calibration >= 1.0:
            raise ValueError(
                f"validation ({self.validation}) + calibration ({self.calibration}) = "
                f"{self.validation + self.calibration:g} leaves no train rows; keep the sum "
                "below 1, e.g. 0.1 and 0.1"
            )
        return self


class Normalization(Strict):
    """Text normalisation used only to find duplicates; stored texts stay as written."""

    unicode_form: Literal["NFC", "NFKC", "none"] = "NFKC"
    lowercase: bool = True
    strip_punctuation: bool = True
    collapse_whitespace: bool = True


class DataSpec(Strict):
    kind: Literal["data"]
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Dataset id (lowercase).")
    description: str = ""
    origins: dict[str, Origin] = Field(min_length=1)
    train: Table
    test: Table
    labels: list[str] = Field(
        min_length=2, description="The label vocabulary: exact strings, in a fixed order."
    )
    split: SplitPolicy = SplitPolicy()
    normalization: Normalization = Normalization()
    dedupe_train: bool = Field(
        True,
        description="Drop train rows whose normalised text repeats an earlier train row or "
        "appears in any held-out or evaluation set (all counted in metrics/data.json).",
    )
    eval_sets: dict[str, EvalSet] = Field(default_factory=dict)
    negatives: list[Table] = Field(
        default_factory=list,
        description="Out-of-scope training examples, used by model specs that ask for an out-of-scope class.",
    )

    @field_validator("labels")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        dup = [x for x in v if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
        if dup:
            raise ValueError(f"labels must be unique; repeated: {sorted(set(dup))}")
        if any(not x.strip() for x in v):
            raise ValueError("labels must be non-empty strings")
        if OOS_LABEL in v:
            # Models name their own out-of-scope output so; a real intent of that name would
            # never be acted on.
            raise ValueError(
                f"label '{OOS_LABEL}' is reserved for the models' out-of-scope class; rename the "
                "intent, or if it marks queries not to act on, declare them under negatives (training) "
                "and eval_sets with kind: out_of_scope (evaluation)"
            )
        return v

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> DataSpec:
        tables = [("train", self.train), ("test", self.test)]
        tables += [(f"eval_sets.{k}.table", e.table) for k, e in self.eval_sets.items()]
        tables += [(f"negatives[{i}]", t) for i, t in enumerate(self.negatives)]
        for where, t in tables:
            if t.origin not in self.origins:
                raise ValueError(
                    f"{where}.origin is '{t.origin}', which is not a key of origins "
                    f"(have: {sorted(self.origins)})"
                )
            if t.file not in self.origins[t.origin].files:
                raise ValueError(
                    f"{where}.file is '{t.file}', which origin '{t.origin}' does not pin; add "
                    f"it with its sha256 under origins.{t.origin}.files or use one of "
                    f"{sorted(self.origins[t.origin].files)}"
                )
            if t.format == "clinc_json" and not t.keys:
                raise ValueError(f"{where}.keys must name at least one list for clinc_json")
        root = _root(info)
        if root is not None:
            for name, o in self.origins.items():
                if isinstance(o.source, LocalSource):
                    folder = root / o.source.path
                    for f in o.files:
                        if not (folder / f).is_file():
                            raise ValueError(
                                f"origins.{name}: local file {folder / f} does not exist; "
                                f"fix origins.{name}.source.path or put the file there"
                            )
        reserved = {"train", "validation", "calibration", "test", "negatives"}
        clash = reserved & set(self.eval_sets)
        if clash:
            raise ValueError(f"eval_sets may not be named {sorted(clash)} (reserved split names)")
        return self


# -------------------------------------------------------------------------- model specs


class NgramConfig(Strict):
    word_ngrams: Pair = Field([1, 2], description="Min and max word n-gram length.")
    char_ngrams: Pair = Field([2, 5], description="Min and max character n-gram length.")
    buckets: int = Field(1 << 17, ge=1024, description="Hash buckets of the embedding bag.")
    dim: PosInt = 64
    dropout: Fraction = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> NgramConfig:
        for name in ("word_ngrams", "char_ngrams"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ValueError(f"{name} is [{lo}, {hi}]: the minimum must not exceed the maximum")
        return self


class LoraConfig(Strict):
    r: PosInt = 8
    alpha: PosInt = 16
    dropout: Fraction = 0.0
    target_modules: list[str] = Field(default_factory=lambda: ["query", "value"])


class EncoderConfig(Strict):
    model: str = Field(
        description="A local model folder, 'package:MODULE[/SUBDIR]' for a model shipped "
        "inside an installed Python package, or a hub id pinned as 'org/name@<40-hex commit>'."
    )
    mode: Literal["full", "frozen", "lora"] = "full"
    pooling: Literal["mean", "cls"] = "mean"
    layers: PosInt = Field(
        1,
        description="Pool each of the last N hidden layers and concatenate them (the head "
        "input grows N-fold). Lower layers carry lexical detail the last one smooths away.",
    )
    normalize: bool = Field(False, description="L2-normalise each pooled layer before it reaches the head.")
    max_length: PosInt = 64
    lora: LoraConfig | None = None

    @model_validator(mode="after")
    def _where(self, info: ValidationInfo) -> EncoderConfig:
        if self.mode == "lora" and self.lora is None:
            object.__setattr__(self, "lora", LoraConfig())
        if self.mode != "lora" and self.lora is not None:
            raise ValueError(f"encoder.lora is set but encoder.mode is '{self.mode}'; use mode: lora")
        root = _root(info)
        if root is not None:
            resolve_encoder_path(self.model, root)
        return self


class HeadConfig(Strict):
    num_labels: PosInt | None = Field(
        None,
        description="Optional cross-check only: the head size always comes from the label "
        "vocabulary (plus one for the out-of-scope class); a number here must agree.",
    )
    out_of_scope_class: bool = Field(
        False, description="Add an out-of-scope class trained on the data spec's negatives."
    )
    dropout: Fraction = 0.1


class OptimizerConfig(Strict):
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: Annotated[list[Fraction], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0)


class ScheduleConfig(Strict):
    kind: Literal["constant", "linear", "cosine"] = "linear"
    warmup_fraction: Fraction = 0.05


class CheckpointConfig(Strict):
    every_steps: PosInt = 100
    keep: PosInt = 2


class Budget(Strict):
    max_minutes: float = Field(60.0, gt=0)
    max_memory_gb: float = Field(8.0, gt=0)


class MpsConfig(Strict):
    # PyTorch's MPS allocator accepts 0 <= low <= high <= 2.0 (0 for high disables the limit).
    high_watermark_ratio: float = Field(1.7, ge=0.0, le=2.0)
    low_watermark_ratio: float = Field(1.4, ge=0.0, le=2.0)

    @model_validator(mode="after")
    def _order(self) -> MpsConfig:
        if self.low_watermark_ratio > self.high_watermark_ratio:
            raise ValueError(
                f"low_watermark_ratio ({self.low_watermark_ratio}) is above "
                f"high_watermark_ratio ({self.high_watermark_ratio}); PyTorch requires "
                "0 <= low <= high <= 2.0, e.g. low 1.4 and high 1.7"
            )
        return self


class ResumeCheckConfig(Strict):
    steps: PosInt = 20
    checkpoint_every: PosInt = 5
    kill_after: PosInt = 7

    @model_validator(mode="after")
    def _fits(self) -> ResumeCheckConfig:
        if self.kill_after >= self.steps:
            raise ValueError(
                f"kill_after ({self.kill_after}) must be below steps ({self.steps}) so that "
                "the run is killed before it ends"
            )
        if self.checkpoint_every > self.kill_after:
            raise ValueError(
                f"checkpoint_every ({self.checkpoint_every}) must not exceed kill_after "
                f"({self.kill_after}), or no checkpoint exists when the run is killed"
            )
        return self


class NeighboursConfig(Strict):
    member: str = Field(
        description="A member of family encoder in mode frozen. Its cached embeddings of the train "
        "partition (and of the negatives, labelled out of scope, when it has an out-of-scope class) "
        "are the memory; a query's k most cosine-similar items vote for their labels."
    )
    k: PosInt = Field(30, le=1000, description="How many nearest training items vote.")
    temperature: float = Field(
        0.02,
        gt=0.0,
        le=1.0,
        description="Softmax temperature over the neighbours' cosine similarities: the smaller, the "
        "more the closest neighbours count.",
    )


class EnsembleConfig(Strict):
    members: list[str] = Field(
        min_length=2,
        max_length=4,
        description="Names of model specs (specs/models/NAME.yaml) whose calibrated log-probabilities "
        "are combined; each must also be listed in params.yaml.",
    )
    neighbours: NeighboursConfig | None = Field(
        None,
        description="Also combine a k-nearest-neighbour vote over a frozen member's embeddings, "
        "weighted like a member.",
    )

    @field_validator("members")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"members must be distinct, got {v}")
        return v


class ModelSpec(Strict):
    kind: Literal["model"]
    description: str = ""
    data: str = Field(description="Path of the data spec, relative to the project root.")
    family: Literal["ngram", "encoder", "ensemble"]
    ngram: NgramConfig | None = None
    encoder: EncoderConfig | None = None
    ensemble: EnsembleConfig | None = None
    head: HeadConfig = HeadConfig()
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    threads: PosInt = 2
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Training processes on this machine (ranks). Each takes an equal shard of every "
        "epoch (the last len(train) mod processes examples of an epoch's order are left out) and "
        "gradients are averaged across them; on CUDA each uses its own GPU. Changes what training "
        "computes: a checkpoint resumes only with the same number.",
    )
    seed: int = 0
    micro_batch: PosInt = 32
    grad_accum: PosInt = 1
    steps: PosInt | None = Field(None, description="Optimizer updates; give steps or epochs.")
    epochs: PosInt | None = Field(None, description="Passes over train; give steps or epochs.")
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    label_smoothing: Fraction = 0.0
    checkpoint: CheckpointConfig = CheckpointConfig()
    budget: Budget = Budget()
    mps: MpsConfig = MpsConfig()
    resume_check: ResumeCheckConfig = ResumeCheckConfig()

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> ModelSpec:
        if self.family == "ensemble":
            if self.processes != 1:
                raise ValueError("processes applies to training; an ensemble is combined, not trained")
            return self._ensemble_rules(info)
        if self.processes > 1 and self.device == "mps":
            raise ValueError(
                f"processes is {self.processes}, but device mps has no multi-process backend in "
                "PyTorch; use processes: 1 (or device cpu / cuda)"
            )
        if self.ensemble is not None:
            raise ValueError(f"family is '{self.family}' but an 'ensemble' section is given; remove it")
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(
                "give exactly one of steps (optimizer updates) or epochs; "
                f"got steps={self.steps}, epochs={self.epochs}"
            )
        if self.steps is not None and self.checkpoint.every_steps > self.steps:
            raise ValueError(
                f"checkpoint.every_steps ({self.checkpoint.every_steps}) is larger than steps "
                f"({self.steps}); no checkpoint would ever be written. Use at most {self.steps}"
            )
        if self.family == "ngram" and self.ngram is None:
            # Written out, because features@m depends on exactly this section.
            raise ValueError("family 'ngram' needs an 'ngram' section; write `ngram: {}` for the defaults")
        other = "encoder" if self.family == "ngram" else "ngram"
        if getattr(self, other) is not None:
            raise ValueError(f"family is '{self.family}' but an '{other}' section is given; remove it")
        if self.family == "encoder" and self.encoder is None:
            raise ValueError("family 'encoder' needs an 'encoder' section with at least 'model'")
        if self.precision == "fp16" and self.device in ("cpu", "mps"):
            raise ValueError(
                f"precision fp16 needs device cuda (got device '{self.device}'); use fp32 or bf16"
            )
        root = _root(info)
        if root is not None:
            data_path = root / self.data
            if not data_path.is_file():
                raise ValueError(
                    f"data is '{self.data}', but {data_path} does not exist; point it at a "
                    "data spec such as specs/data/banking77.yaml"
                )
            data = load_spec(data_path, DataSpec)
            expected = len(data.labels) + (1 if self.head.out_of_scope_class else 0)
            if self.head.num_labels is not None and self.head.num_labels != expected:
                raise ValueError(
                    f"head.num_labels is {self.head.num_labels}, but the data spec {self.data} "
                    f"has {len(data.labels)} labels"
                    + (" + 1 out-of-scope class" if self.head.out_of_scope_class else "")
                    + f", so the head has {expected} outputs; remove head.num_labels (the size comes "
                    f"from the vocabulary) or set it to {expected}"
                )
            if self.head.out_of_scope_class and not data.negatives:
                raise ValueError(
                    f"head.out_of_scope_class is true but the data spec {self.data} declares no "
                    "negatives; add a 'negatives' table there or set it to false"
                )
        return self

    def _ensemble_rules(self, info: ValidationInfo) -> ModelSpec:
        if self.ensemble is None:
            raise ValueError("family 'ensemble' needs an 'ensemble' section with 'members'")
        for other in ("ngram", "encoder"):
            if getattr(self, other) is not None:
                raise ValueError(f"family is 'ensemble' but an '{other}' section is given; remove it")
        root = _root(info)
        if root is None:
            return self
        oos = set()
        for m in self.ensemble.members:
            path = root / "specs" / "models" / f"{m}.yaml"
            if not path.is_file():
                raise ValueError(f"ensemble.members names '{m}', but {path} does not exist")
            member = load_spec(path, ModelSpec)
            if member.family == "ensemble":
                raise ValueError(f"ensemble.members: '{m}' is itself an ensemble; list its members instead")
            if member.data != self.data:
                raise ValueError(
                    f"ensemble.members: '{m}' uses data '{member.data}' but this ensemble uses '{self.data}'"
                )
            oos.add(member.head.out_of_scope_class)
        if len(oos) > 1:
            raise ValueError(
                "ensemble.members disagree on head.out_of_scope_class, so their outputs differ; "
                "make it the same for every member"
            )
        near = self.ensemble.neighbours
        if near is not None:
            if near.member not in self.ensemble.members:
                raise ValueError(
                    f"ensemble.neighbours.member is '{near.member}', which is not one of "
                    f"ensemble.members {self.ensemble.members}; name one of them"
                )
            member = load_spec(root / "specs" / "models" / f"{near.member}.yaml", ModelSpec)
            if member.family != "encoder" or member.encoder.mode != "frozen":
                mode = f"encoder, mode {member.encoder.mode}" if member.encoder else member.family
                raise ValueError(
                    f"ensemble.neighbours.member '{near.member}' is of family {mode}; the neighbours "
                    "are searched in cached embeddings, which only a frozen encoder has: name a member "
                    "of family encoder with mode frozen"
                )
        return self


# --------------------------------------------------------------------------- gate spec


class Thresholds(Strict):
    heldout_accuracy_min: float = Field(0.90, ge=0.0, le=1.0)
    real_utterance_accuracy_min: float = Field(1.0, ge=0.0, le=1.0)
    ece_max: float = Field(0.10, ge=0.0, le=1.0)
    false_positive_action_rate_max: float = Field(0.01, ge=0.0, le=1.0)
    wrong_action_rate_max: float = Field(0.02, ge=0.0, le=1.0)
    coverage_min: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Least share of in-scope test queries acted on. A model that sends everything "
        "to review makes no wrong action and does no work. null: no such rule.",
    )
    require_resume_equivalence: bool = True


class ProductionComparison(Strict):
    enabled: bool = True
    metric: Literal["heldout_accuracy"] = "heldout_accuracy"
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    bootstrap_samples: int = Field(1000, ge=100)
    seed: int = 0


class PolicyFit(Strict):
    confidence: float = Field(
        0.9,
        ge=0.0,
        lt=1.0,
        description="calibrate@m picks the routing policy whose wrong-action and false-positive "
        "limits hold for the one-sided Clopper-Pearson upper bound at this confidence on the "
        "calibration data (0: the rates seen). A set too small to show its limit even with no "
        "error is held to the rate seen, and calibration.json records which applied.",
    )


class GateSpec(Strict):
    kind: Literal["gate"]
    description: str = ""
    thresholds: Thresholds = Thresholds()
    policy_fit: PolicyFit = PolicyFit()
    compare_to_production: ProductionComparison = ProductionComparison()


T = TypeVar("T", bound=Strict)

SPEC_KINDS: dict[str, type[Strict]] = {"data": DataSpec, "model": ModelSpec, "gate": GateSpec}


# One folder, or none, is a list too (params.yaml's `mirror`).
Folders = Annotated[
    list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) and v else [] if v in (None, "") else v)
]
FOLDERS = TypeAdapter(Folders, config=ConfigDict(strict=True))


class Params(Strict):
    """params.yaml: which specs the pipeline runs (no `kind`: it is the pipeline's own file)."""

    data: str = Field(description="the data spec, e.g. specs/data/banking77.yaml")
    models: list[str] = Field(
        min_length=1, description="model spec names, e.g. [ngram] for specs/models/ngram.yaml"
    )
    gate: str = Field(description="the gate spec, e.g. specs/gate.yaml")
    mirror: Folders = Field(
        default_factory=list, description="folders tried for raw data files before any download"
    )


def load_params(root: Path) -> Params:
    path = root / "params.yaml"
    if not path.is_file():
        raise UserError(f"{path}: not found; run reprogate from the project root.")
    try:
        return Params.model_validate(read_yaml(path))
    except ValidationError as err:
        raise UserError(format_validation_error(path, err, Params)) from None


# ------------------------------------------------------------------------------ helpers


def _root(info: ValidationInfo) -> Path | None:
    ctx = info.context or {}
    return ctx.get("root")


def find_root(start: Path) -> Path:
    """The project root: nearest folder at or above `start` holding params.yaml or .dvc."""
    start = start.resolve()
    for d in [start, *start.parents]:
        if (d / "params.yaml").is_file() or (d / ".dvc").is_dir():
            return d
    return start if start.is_dir() else start.parent


_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def resolve_encoder_path(model: str, root: Path) -> str:
    """Where transformers should load the encoder from; raises ValueError with a fix."""
    if model.startswith("package:"):
        module, _, sub = model.removeprefix("package:").partition("/")
        spec = importlib.util.find_spec(module) if module else None
        if spec is None or spec.origin is None:
            raise ValueError(
                f"encoder.model is '{model}', but no installed package '{module}' was found; "
                "install it (it is in requirements.lock) or give a local folder"
            )
        folder = Path(spec.origin).parent / sub
        if not (folder / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': {folder} holds no config.json")
        return str(folder)
    local = root / model
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': folder {local} holds no config.json")
        return str(local)
    if _HUB_ID.match(model):
        return model
    raise ValueError(
        f"encoder.model is '{model}': not a folder under {root}, not 'package:MODULE/SUBDIR', "
        "and not a pinned hub id 'org/name@<40-hex commit>'"
    )


class _SpecLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error: PyYAML would keep
    the last one silently, and a spec would train with a value its author did not see."""

    def construct_mapping(self, node, deep=False):
        self.flatten_mapping(node)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.setdefault(key, key_node.start_mark.line)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first at line {first + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: file not found; check the path (specs live under specs/).")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_SpecLoader)  # noqa: S506 (safe loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        fix = "keep one of them" if "given twice" in problem else "fix the indentation or quoting there"
        raise UserError(f"{path}: not valid YAML{where}: {problem}; {fix}.") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason}); save it as UTF-8.") from None
    if not isinstance(raw, dict):
        raise UserError(
            f"{path}: a spec must be a YAML mapping (key: value lines), got {type(raw).__name__}; "
            "start it with 'kind: data', 'kind: model' or 'kind: gate'."
        )
    return raw


def load_spec(path: Path, expect: type[T] | None = None) -> T:
    """Read and validate one spec file; raise UserError naming file, field, value and fix."""
    path = Path(path)
    raw = read_yaml(path)
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in SPEC_KINDS:
        raise UserError(
            f"{path}: field 'kind' is {kind!r}; expected one of {sorted(SPEC_KINDS)}. "
            "Add e.g. 'kind: model' as the first line."
        )
    cls = SPEC_KINDS[kind]
    if expect is not None and cls is not expect:
        want = next(k for k, v in SPEC_KINDS.items() if v is expect)
        raise UserError(f"{path}: field 'kind' is '{kind}', but a '{want}' spec is expected here.")
    try:
        return cls.model_validate(raw, context={"root": find_root(path.parent)})  # type: ignore[return-value]
    except ValidationError as err:
        raise UserError(format_validation_error(path, err, cls)) from None
    except UserError as err:
        # A spec this one refers to is broken: name both.
        raise UserError(f"{path}: refers to a spec that is not valid:\n{err}") from None


def spec_hash(spec: BaseModel, exclude: set[str] | None = None) -> str:
    """Hash of the validated content (comments and key order do not change it)."""
    blob = json.dumps(spec.model_dump(mode="json", exclude=exclude), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# Model spec fields that do not change what training computes. A run stopped by its budget
# resumes from its checkpoint once the budget is raised; a new checkpoint interval keeps the
# checkpoints already written.
NOT_IN_TRAINING = {"description", "checkpoint", "budget", "resume_check"}


def training_hash(spec: ModelSpec) -> str:
    """Hash of the model spec fields that decide the trained weights: a checkpoint's run."""
    return spec_hash(spec, NOT_IN_TRAINING)


def iter_spec_files(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(
                f for f in p.rglob("*.y*ml") if f.suffix in (".yaml", ".yml") and "schema" not in f.parts
            )
        elif p.exists():
            files.append(p)
        else:
            raise UserError(f"{p}: no such file or folder; give a spec file or a folder of specs.")
    return files


def json_schemas() -> dict[str, dict[str, Any]]:
    return {kind: cls.model_json_schema() for kind, cls in SPEC_KINDS.items()}
