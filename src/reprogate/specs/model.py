"""Model specs: family, device, precision, optimisation, checkpoints, budget.

What a spec shares whatever its family is declared here; each family's own section lives with
its family (specs/families/), and `ModelSpec.model_validate` reads a spec as the class with its
family's section (`spec_class`), so a family this package has never heard of validates too.

Rules here read nothing but the spec itself. Rules that read another file (the data spec a
model names, an ensemble's members, the encoder folder) live in specs/loader.py.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, create_model, model_validator

from reprogate.specs.base import Fraction, PosInt, Strict, content_hash
from reprogate.specs.family import BUILTIN, Family, family


class HeadConfig(Strict):
    num_labels: PosInt | None = Field(
        None,
        description="Optional cross-check only: the head size always comes from the label "
        "vocabulary (plus one for the out-of-scope class); a number here must agree.",
    )
    out_of_scope_class: bool = Field(
        False, description="Add an out-of-scope class trained on the data spec's negatives."
    )
    out_of_scope_weight: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Loss weight of each negative against 1 for an in-scope example. Negatives "
        "can outnumber all intents together (BANKING77: 11,870 against 7,959), and at weight 1 the "
        "out-of-scope class wins for in-domain phrasings it has not seen.",
    )
    dropout: Fraction = 0.1

    @model_validator(mode="after")
    def _weight_needs_class(self) -> HeadConfig:
        # By value, not by presence: a model folder's config repeats every field of its spec.
        if self.out_of_scope_weight != 1.0 and not self.out_of_scope_class:
            raise ValueError(
                "out_of_scope_weight weighs the out-of-scope class's examples; set "
                "out_of_scope_class: true, or remove out_of_scope_weight"
            )
        return self


class OptimizerConfig(Strict):
    lr: float = Field(1e-3, gt=0)
    head_lr: float | None = Field(
        None,
        gt=0,
        description="The head's learning rate when it differs from lr: a head learnt from scratch in "
        "a few hundred updates needs far more than a pretrained encoder can take.",
    )
    weight_decay: float = Field(0.01, ge=0)
    betas: Annotated[list[Fraction], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0)
    implementation: Literal["fused", "default"] = Field(
        "fused",
        description="fused: torch's fused AdamW, whose every op is correctly rounded, so the weights "
        "are the same bits on any vendor's CPU. default: torch's foreach AdamW, whose float32 sqrt "
        "(MKL's vsSqrt on CPU) is the vendor's own rounding (docs/reproducibility.md). Part of the "
        "run's identity: changing it starts a new run.",
    )


class ScheduleConfig(Strict):
    kind: Literal["constant", "linear", "cosine"] = "linear"
    warmup_fraction: Fraction = 0.05
    min_lr_fraction: Fraction = Field(
        0.0, description="cosine only: the floor the learning rate decays to, as a share of lr."
    )


class CheckpointConfig(Strict):
    every_steps: PosInt = 100
    keep: PosInt = 2


class Budget(Strict):
    max_minutes: float = Field(
        60.0,
        gt=0,
        description="the wall-clock limit of a run of fixed steps or epochs (a planned run's "
        "limit is max_slowdown x its plan's minutes instead)",
    )
    max_slowdown: float = Field(
        3.0,
        gt=1.0,
        description="a planned run (budget.train_minutes) may take this many times the minutes its "
        "committed plan measured, so a machine up to this much slower still trains the committed number "
        "of updates; past it the run stops checkpointed and says how much slower this machine is",
    )
    max_memory_gb: float = Field(8.0, gt=0)
    train_minutes: float | None = Field(
        None,
        gt=0,
        description="causal_lm only, instead of steps or epochs: train as many updates as fit in "
        "this many minutes here. `reprogate plan --write` measures them once into "
        "specs/models/<m>.plan.yaml (committed); training reads the number from there.",
    )


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
    kill_rank: int | None = Field(
        None,
        ge=0,
        description="With processes > 1: SIGKILL only this rank after update kill_after and let the "
        "engine (elastic agent or Ray Train) restart the worker group by itself; without it every "
        "process is killed and the run is started again.",
    )

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


class RayConfig(Strict):
    address: str | None = Field(
        None,
        description="A running Ray cluster to join (`ray start`, KubeRay): HOST:PORT of its GCS, or "
        "ray://HOST:PORT. Without it, RAY_ADDRESS; without that, a Ray of this run alone on loopback.",
    )
    connect_timeout_s: float = Field(
        20.0, gt=0, le=600, description="How long to wait for ray.address to answer."
    )


class ModelSpec(Strict):
    kind: Literal["model"]
    description: str = ""
    data: str = Field(description="Path of the data spec, relative to the project root.")
    family: str = Field(
        description="A built-in family (ngram, encoder, ensemble, causal_lm, export), an entry point "
        "of the group reprogate.families, or module:Class (docs/your-own-model.md). Its settings are "
        "the section named after the family."
    )
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
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="How often the executor restarts the worker group after a rank fails (the "
        "elastic agent's max_restarts, Ray's FailureConfig.max_failures); each restart resumes "
        "from the last committed checkpoint. Past it the run stops with the failed rank's last line.",
    )
    executor: Literal["torch", "ray"] = Field(
        "torch",
        description="What runs the ranks: PyTorch's elastic agent (torch; on several machines via "
        "torchrun --nnodes) or Ray Train's TorchTrainer workers (ray). The same loop and "
        "checkpoints: the trained state is the same.",
    )
    ray: RayConfig = RayConfig()
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
    augment: bool = Field(
        False,
        description="Also train on the data spec's augmented variants of the train partition "
        "(stage augment; the data spec needs an `augment` section).",
    )

    @property
    def family_def(self) -> Family:
        return family(self.family)

    @property
    def config(self) -> Any:
        """The family's own section."""
        return getattr(self, self.family_def.name)

    @property
    def trained(self) -> bool:
        """False for the families built from other candidates: an ensemble, an export."""
        return self.family_def.trained

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> ModelSpec:  # type: ignore[override]
        """Validated as the spec class of the family it names (ModelSpec itself has no section)."""
        if cls is ModelSpec and isinstance(obj, dict):
            try:
                cls = spec_class(obj.get("family"))
            except ValueError as e:
                error = {
                    "type": "value_error",
                    "loc": ("family",),
                    "input": obj.get("family"),
                    "ctx": {"error": e},
                }
                raise ValidationError.from_exception_data("ModelSpec", [error]) from None
        return super().model_validate(obj, **kwargs)

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, raw: Any) -> Any:
        if not isinstance(raw, dict) or cls is ModelSpec:
            return raw
        own = family(raw.get("family")).name
        # Another family's section left null says nothing (a model folder written before the
        # sections moved to their families holds every one of them): dropped, not refused.
        raw = {k: v for k, v in raw.items() if not (k in BUILTIN and k != own and v is None)}
        for other in (*BUILTIN, own):
            article = "an" if other[0] in "aeiou" else "a"
            if other != own and other in raw:
                raise ValueError(
                    f"family is '{raw['family']}' but {article} '{other}' section is given; remove it"
                )
            if other == own and other not in raw:
                raise ValueError(
                    f"family '{raw['family']}' needs {article} '{own}' section; write `{own}: {{}}` for "
                    "the defaults (see its fields in specs/schema/model.schema.json or your family's config)"
                )
        return raw

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        if not self.trained:
            if self.processes != 1 or self.executor != "torch":
                raise ValueError(
                    f"processes and executor apply to training; family {self.family} is built from "
                    "other candidates, not trained"
                )
            return self
        if self.processes > 1 and self.device == "mps":
            raise ValueError(
                f"processes is {self.processes}, but device mps has no multi-process backend in "
                "PyTorch; use processes: 1 (or device cpu / cuda)"
            )
        if self.executor == "ray" and self.device == "mps":
            raise ValueError("executor ray runs ranks on CPU or CUDA; device mps is not one of them")
        kill = self.resume_check.kill_rank
        if kill is not None and self.processes == 1 and self.executor == "torch":
            raise ValueError(
                "resume_check.kill_rank needs an engine that restarts a killed rank: processes > 1, "
                "or executor ray; with one process of executor torch omit it (the whole run is killed)"
            )
        if kill is not None and kill >= self.processes:
            raise ValueError(
                f"resume_check.kill_rank is {kill}, but the run has processes: {self.processes} "
                f"(ranks 0 to {self.processes - 1}); use a rank below {self.processes}, or omit it"
            )
        self._length_rules()
        if self.steps is not None and self.checkpoint.every_steps > self.steps:
            raise ValueError(
                f"checkpoint.every_steps ({self.checkpoint.every_steps}) is larger than steps "
                f"({self.steps}); no checkpoint would ever be written. Use at most {self.steps}"
            )
        if self.precision == "fp16" and self.device in ("cpu", "mps"):
            raise ValueError(
                f"precision fp16 needs device cuda (got device '{self.device}'); use fp32 or bf16"
            )
        self.family_def.rules(self)
        return self

    def _length_rules(self) -> None:
        minutes = self.budget.train_minutes
        planned = self.family_def.planned
        if minutes is not None and not planned:
            plans = ", ".join(n for n in BUILTIN if family(n).planned)
            raise ValueError(
                f"budget.train_minutes applies to family {plans} (a family that plans its length); "
                f"family {self.family} gives steps or epochs"
            )
        given = [f"{n}={v}" for n, v in (("steps", self.steps), ("epochs", self.epochs)) if v is not None]
        if minutes is not None:
            given.append(f"budget.train_minutes={minutes:g}")
        if len(given) != 1:
            raise ValueError(
                "give exactly one of steps (optimizer updates) or epochs"
                + (" or budget.train_minutes" if planned else "")
                + f"; got {', '.join(given) or 'none'}"
            )


# Model spec fields that do not change what training computes. A run stopped by its budget
# resumes from its checkpoint once the budget is raised; a new checkpoint interval keeps the
# checkpoints already written. The executor runs the same loop with the same gloo/NCCL
# all-reduce, so a run started under one resumes under the other.
NOT_IN_TRAINING = {
    "description", "checkpoint", "budget", "resume_check", "max_restarts", "executor", "ray",
}  # fmt: skip


# Fields added after runs existed, left out of the hash while switched off, so that a checkpoint
# written before the field existed keeps its run's identity (and resumes) after an upgrade.
# A spec written before `implementation` existed ran the default AdamW: saying so keeps its hash.
ADDED_OFF = {
    ("augment",): False,
    ("encoder", "contrastive"): None,
    ("optimizer", "head_lr"): None,
    ("optimizer", "implementation"): "default",
}


def training_hash(spec: ModelSpec) -> str:
    """Hash of the model spec fields that decide the trained weights: a checkpoint's run."""
    dumped = spec.model_dump(mode="json", exclude=NOT_IN_TRAINING)
    for (*parents, key), off in ADDED_OFF.items():
        section = dumped
        for p in parents:
            section = section.get(p) or {}
        if key in section and section[key] == off:
            del section[key]
    return content_hash(dumped)


def spec_class(name: object) -> type[ModelSpec]:
    """ModelSpec with the section of family `name` (ValueError with the fix when there is none)."""
    return _spec_class(family(name).name if not isinstance(name, str) else name)


@cache
def _spec_class(name: str) -> type[ModelSpec]:
    declared = family(name)
    if declared.name in ModelSpec.model_fields:
        raise ValueError(
            f"family '{name}' is named '{declared.name}', a field every model spec has; rename it"
        )
    section = (declared.config, Field(description=f"Family {declared.name}'s settings."))
    return create_model(f"ModelSpec_{declared.name}", __base__=ModelSpec, **{declared.name: section})


def schema_class() -> type[ModelSpec]:
    """ModelSpec with every built-in family's section, optional: what specs/schema/ documents."""
    sections = {n: (family(n).config | None, None) for n in BUILTIN}
    return create_model("ModelSpec", __base__=ModelSpec, **sections)
