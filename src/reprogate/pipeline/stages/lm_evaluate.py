"""Stage `lm_evaluate@m`: a language model scored on whole splits, and samples from fixed prompts.

results/<m>/eval.json (lm_records.LmEvaluation): per split (validation, the headline, and train)
every token after the first predicted once in windows of the model's context (lm_eval.py):
nats per token, bits per token, per character and per byte (comparable across tokenizers),
perplexity; parameters with and without embeddings, tokens seen, tokens per parameter, and
tokens/s as planned (the committed plan's measurement, so the file is the same on every rerun).
metrics/<m>/eval.json: its headline. predictions/<m>/samples.jsonl: a continuation of each of
the text spec's prompts, sampled with a fixed seed.
"""

from __future__ import annotations

from typing import Any

from reprogate.pipeline.context import Context, Result
from reprogate.specs.pipeline import Pipeline
from reprogate.utils import paths
from reprogate.utils.paths import LM_FILES

PER_MODEL = "all"
NUMERIC = True  # its outputs are floats: it reruns when params.yaml's numerics change


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [str(paths.CORPUS), "data/tokens/${key}", *(f"models/${{key}}/{f}" for f in LM_FILES)],
        "params": [{p.data: None}, {"${item.plan}": None}],
        "outs": [
            "predictions/${key}",
            {"results/${key}/eval.json": {"cache": False}},
            {"metrics/${key}/eval.json": {"cache": False}},
        ],
    }


def run(ctx: Context) -> Result:
    from reprogate.lm.evaluate import evaluate, summary

    return Result(summary(ctx.model, evaluate(ctx.root, ctx.model, ctx.log)))
