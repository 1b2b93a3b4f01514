"""What stage `tokenize@m` runs: the corpus turned into model m's token ids once
(pipeline/stages/tokenize.py declares it to DVC)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from reprogate.lm import tokenizer as lm_tokenizer
from reprogate.records.base import write
from reprogate.records.lm import TokenPart, TokenRecord
from reprogate.specs.families.causal_lm import CausalLmConfig
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils import paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.console import say
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file

PARTS = ("train", "validation")


def corpus_text(root: Path, part: str) -> str:
    path = root / paths.CORPUS / f"{part}.txt"
    if not path.is_file():
        raise UserError(f"{path} does not exist: run `dvc repro corpus` (or `reprogate stage corpus`) first.")
    return path.read_text(encoding="utf-8")


def tokenize(root: Path, name: str, log=None) -> dict[str, Any]:
    log = log or say
    started = time.perf_counter()
    spec = load_spec(root / paths.model_spec(name), ModelSpec)
    if not isinstance(spec.config, CausalLmConfig):
        raise UserError(f"specs/models/{name}.yaml: tokenize is for family causal_lm, not {spec.family}.")
    texts = {p: corpus_text(root, p) for p in PARTS}
    cfg = spec.causal_lm.tokenizer
    if cfg.kind == "char" and (n := len(set(texts["train"]) | set(texts["validation"]))) > cfg.max_vocab:
        raise UserError(
            f"specs/models/{name}.yaml: field 'causal_lm.tokenizer.max_vocab' is {cfg.max_vocab}, but the "
            f"corpus has {n:,} distinct characters, so a char vocabulary (and its embedding of {n:,} x "
            f"{spec.causal_lm.d_model}) would be that large: refused before it is built. Raise max_vocab "
            "if that is meant, or use tokenizer kind: bpe with a vocab_size."
        )
    tok = lm_tokenizer.train(cfg, texts["train"], texts["train"] + texts["validation"])
    parts = {}
    with replace_dir(root / paths.tokens_dir(name)) as tmp:
        (tmp / "tokenizer.json").write_text(tok.to_json(), encoding="utf-8")
        for p, text in texts.items():
            ids = torch.tensor(tok.encode(text), dtype=torch.int32)
            save_file({"ids": ids}, str(tmp / f"{p}.safetensors"))
            src = root / paths.CORPUS / f"{p}.txt"
            parts[p] = TokenPart(
                tokens=len(ids), chars=len(text), bytes=len(text.encode()), source_sha256=sha256_file(src)
            )
            log(f"tokenize: {name}/{p}: {len(ids):,} tokens")
        record = TokenRecord(
            tokenizer=cfg.model_dump(mode="json"),
            vocab_size=tok.vocab_size,
            tokenizer_sha256=sha256_file(tmp / "tokenizer.json"),
            parts=parts,
        )
        write(tmp / "manifest.json", record)
    return {**record.model_dump(mode="json"), "seconds": round(time.perf_counter() - started, 2)}


def summary(name: str, m: dict[str, Any]) -> str:
    t = m["parts"]["train"]
    return (
        f"tokenize: {name}: {m['tokenizer']['kind']} vocabulary of {m['vocab_size']}, train "
        f"{t['tokens']:,} tokens ({t['chars'] / t['tokens']:.2f} characters each), {m['seconds']:.1f} s"
    )
