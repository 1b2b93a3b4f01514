"""The production language model: `reprogate generate` and `POST /generate` answer with it.

The same rules as the classifier's production (production.py): the record HEAD holds, and
only the files it pins (the copy promote kept, or the workspace's model while it is still
exactly those files). Generation is bounded: a prompt of at most MAX_PROMPT_CHARS characters,
at most MAX_NEW_TOKENS new tokens, and a prompt the model's vocabulary cannot spell is a
user mistake (4xx over HTTP), never a crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reprogate.folder.files import model_version
from reprogate.folder.manifest import Files
from reprogate.lm.folder import load_lm
from reprogate.lm.tokenizer import LmTokenizer
from reprogate.models.causal_lm import CausalLm
from reprogate.predict.production import Sources, production_files, provenance, read_promoted
from reprogate.records.production import Promoted
from reprogate.runtime.device import resolve_device
from reprogate.utils.errors import UserError

MAX_PROMPT_CHARS = 4000
MAX_NEW_TOKENS = 2000


@dataclass(frozen=True)
class LoadedLm:
    """One servable language model: never mutated, so a request keeps it across a swap."""

    name: str
    version: str
    model: CausalLm
    tokenizer: LmTokenizer
    record: Promoted | None
    source_sha256: str | None
    device: torch.device
    dir: Path
    verified: bool | None = None  # as predict/production.Loaded's
    unverified: str | None = None

    def generate(
        self,
        prompt: str,
        max_tokens: int = 200,
        seed: int = 0,
        temperature: float = 0.8,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        if not prompt:
            raise UserError("the prompt is empty; give at least one character to continue from")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt has {len(prompt)} characters; give at most {MAX_PROMPT_CHARS}")
        if not 1 <= max_tokens <= MAX_NEW_TOKENS:
            raise UserError(f"max tokens is {max_tokens}; ask for 1 to {MAX_NEW_TOKENS}")
        if not 0 < temperature <= 5:
            raise UserError(f"temperature is {temperature}; give a number above 0 and at most 5")
        ids = self.tokenizer.encode(prompt)
        start = time.perf_counter()
        out = self.model.generate(ids, max_tokens, temperature, top_k, torch.Generator().manual_seed(seed))
        return {
            "prompt": prompt,
            "text": self.tokenizer.decode(out),
            "tokens": len(out),
            "seed": seed,
            "temperature": temperature,
            "model_version": self.version,
            "latency_ms": round((time.perf_counter() - start) * 1000, 3),
        }


def is_language_model(model_dir: Path) -> bool:
    return (model_dir / "assets" / "tokenizer.json").is_file() and not (model_dir / "labels.json").is_file()


def load_generator(root: Path, model_dir: Path | None = None, device: str = "auto") -> LoadedLm:
    """The production language model (or `model_dir`), loaded on `device` and warmed up."""
    record, source = None, None
    if model_dir is None:
        sources = Sources.read(root)
        source = sources.identity()
        record = read_promoted(root, sources)
        if not record.generates:
            raise UserError(
                f"{root}: production holds {record.model} ({record.family}), a classifier: generate and "
                "POST /generate answer with a language model; use `reprogate predict` there, or run this in "
                "the language-model project (lm/)."
            )
        opened = production_files(root, record)
        model_dir, files = opened.dir, opened.files
    elif not is_language_model(model_dir):
        raise UserError(f"--model {model_dir}: not a language-model folder (no assets/tokenizer.json).")
    else:
        files = Files.read(model_dir)
    dev = resolve_device(device, "--device", "Use --device cpu.")
    model, tokenizer, _ = load_lm(model_dir, dev, files)
    version = record.model_version if record else model_version(files)
    verified, why = provenance(root) if record else (None, None)
    loaded = LoadedLm(
        model_dir.name, version, model, tokenizer, record, source, dev, model_dir, verified, why
    )
    loaded.model.generate(tokenizer.encode(tokenizer.decode([0])), 1, 1.0, None, torch.Generator())
    return loaded
