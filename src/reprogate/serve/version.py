"""GET /version: what `reprogate serve` is answering with, from its production record, and
whether `reprogate promote` made the commit that put that record there."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from reprogate.predict.lm import LoadedLm
from reprogate.utils.errors import relative

log = logging.getLogger("reprogate.serve.app")


def describe(cur, root: Path) -> dict[str, Any]:
    """GET /version: what is being served, from its production record."""
    r = cur.record
    if isinstance(cur, LoadedLm):
        return {
            "model": cur.name,
            "model_version": cur.version,
            "family": "causal_lm",
            "data_sha256": r.data_sha256 if r else None,
            "code_commit": r.code_commit if r else None,
            "val_bits_per_char": r.val_bits_per_char if r else None,
            "vocab_size": cur.tokenizer.vocab_size,
            "device": str(cur.device),
            "files": relative(str(cur.dir), root),
            "promotion": promotion(cur),
        }
    return {
        "model": cur.name,
        "model_version": cur.version,
        "data_sha256": r.data_sha256 if r else None,
        "code_commit": r.code_commit if r else None,
        "calibration": {
            "temperature": cur.policy.temperature,
            "threshold": cur.policy.threshold,
            "margin": cur.policy.margin,
        },
        "labels": len(cur.scorer.labels),
        # What it may answer `act` with: a client (Home Assistant) offers these to allow.
        "intents": [x for i, x in enumerate(cur.scorer.labels) if i != cur.scorer.oos_index],
        "device": str(cur.scorer.device),
        "files": relative(str(cur.scorer.dir), root),
        "promotion": promotion(cur),
    }


def say_unverified(cur) -> None:
    if getattr(cur, "verified", None) is False:
        log.warning("serving %s, but %s", cur.version, cur.unverified)


def promotion(cur) -> dict[str, Any] | None:
    """Whether `reprogate promote` made the commit that put production there (None: a folder
    asked for by path, no production record)."""
    if cur.record is None:
        return None
    return {"verified": cur.verified, **({"why": cur.unverified} if cur.unverified else {})}
