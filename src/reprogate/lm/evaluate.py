"""What stage `lm_evaluate@m` runs: a language model's bits per character on whole splits, and
its samples (pipeline/stages/lm_evaluate.py declares it to DVC)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from reprogate.folder.files import model_version
from reprogate.folder.manifest import Files
from reprogate.lm import scoring as lm_eval
from reprogate.lm.folder import load_lm
from reprogate.lm.tokenizer import LmTokenizer
from reprogate.lm.training import planned_steps
from reprogate.records.base import load, write
from reprogate.records.lm import LmEvalMetrics, LmEvaluation, LmSet, SampleLine
from reprogate.records.train import Fingerprint
from reprogate.runtime.device import scoring_device, seed_everything
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.specs.text import TextSpec
from reprogate.utils import jsonl, paths
from reprogate.utils.console import say
from reprogate.utils.hashing import sha256_file

SETS = ("validation", "train")


def scored_set(model, tok: LmTokenizer, root: Path, name: str, part: str, context: int, device) -> LmSet:
    corpus = root / paths.CORPUS / f"{part}.txt"
    text = corpus.read_text(encoding="utf-8")
    ids = load_file(str(root / paths.tokens_dir(name) / f"{part}.safetensors"))["ids"]
    s = lm_eval.score(model, ids, context, device)
    # The first token has nothing before it and is not predicted: its characters are not counted.
    first = tok.decode([int(ids[0])])
    chars, n_bytes = len(text) - len(first), len(text.encode()) - len(first.encode())
    return LmSet(
        n_tokens=s.tokens,
        n_chars=chars,
        n_bytes=n_bytes,
        windows=s.windows,
        nats_per_token=s.nats_per_token,
        bits_per_token=lm_eval.bits(s.nats, s.tokens),
        bits_per_char=lm_eval.bits(s.nats, chars),
        bits_per_byte=lm_eval.bits(s.nats, n_bytes),
        nats_per_char=s.nats / chars,
        perplexity=math.exp(s.nats_per_token),
        data_sha256=sha256_file(corpus),
    )


def samples(model, tok: LmTokenizer, text: TextSpec, version: str) -> list[SampleLine]:
    s, out = text.samples, []
    for i, prompt in enumerate(s.prompts):
        gen = torch.Generator().manual_seed(s.seed + i)
        ids = model.generate(tok.encode(prompt), s.max_new_tokens, s.temperature, s.top_k, gen)
        out.append(
            SampleLine(
                prompt=prompt,
                text=tok.decode(ids),
                seed=s.seed + i,
                temperature=s.temperature,
                top_k=s.top_k,
                max_new_tokens=s.max_new_tokens,
                model_version=version,
            )
        )
    return out


def evaluate(root: Path, name: str, log=None) -> dict[str, Any]:
    log = log or say
    spec_path = root / paths.model_spec(name)
    spec = load_spec(spec_path, ModelSpec)
    device = scoring_device(spec, spec_path)
    seed_everything(spec.seed, spec.threads, device)
    model_dir = root / paths.model_dir(name)
    files = Files.read(model_dir)  # each file once: the version is of the bytes loaded
    model, tok, _ = load_lm(model_dir, device, files)
    version = model_version(files)
    context = spec.causal_lm.context
    sets = {}
    for part in SETS:
        sets[part] = scored_set(model, tok, root, name, part, context, device)
        log(f"lm_evaluate: {name}/{part}: {sets[part].bits_per_char:.4f} bits/char")
    total, no_emb = model.parameter_counts()
    seen = spec.micro_batch * spec.grad_accum * spec.processes * context
    steps = planned_steps(root, name, spec, spec_path) if spec.budget.train_minutes is not None else None
    n_steps = steps.steps if steps else _trained_steps(root, name)
    evaluation = LmEvaluation(
        model_version=version,
        device=device.type,
        sets=sets,
        parameters=total,
        parameters_without_embeddings=no_emb,
        tokens_seen=seen * n_steps,
        tokens_per_parameter=round(seen * n_steps / total, 3),
        tokens_per_s=round(seen / steps.measured.update_s, 1) if steps else None,
        context=context,
        vocab_size=tok.vocab_size,
        tokenizer=spec.causal_lm.tokenizer.kind,
    )
    text = load_spec(root / spec.data, TextSpec)
    pred = root / paths.predictions_dir(name)
    pred.mkdir(parents=True, exist_ok=True)
    for old in pred.iterdir():
        old.unlink()
    with open(pred / "samples.jsonl", "w", encoding="utf-8") as f:
        for line in samples(model, tok, text, version):
            f.write(jsonl.line(line.model_dump(mode="json")))
    write(root / paths.results_dir(name) / "eval.json", evaluation)
    write(root / paths.metrics_dir(name) / "eval.json", LmEvalMetrics.of(evaluation))
    return evaluation.model_dump(mode="json")


def _trained_steps(root: Path, name: str) -> int:
    fp = load(root / paths.model_dir(name) / "fingerprint.json", Fingerprint, "run `dvc repro`.")
    return fp.total_steps or 0


def summary(name: str, m: dict[str, Any]) -> str:
    v = m["sets"]["validation"]
    return (
        f"lm_evaluate: {name}: validation {v['bits_per_char']:.4f} bits/char "
        f"({v['nats_per_char']:.4f} nats/char, perplexity {v['perplexity']:.2f} per token) over "
        f"{v['n_tokens']:,} tokens; train {m['sets']['train']['bits_per_char']:.4f} bits/char; "
        f"{m['parameters']:,} parameters, {m['tokens_per_parameter']:g} tokens each"
    )
