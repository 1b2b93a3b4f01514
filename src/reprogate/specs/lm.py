"""A language model's plan (`kind: plan`); its family's section is specs/families/causal_lm.py.

A plan file (`kind: plan`, specs/models/<m>.plan.yaml) fixes how many updates a
`budget.train_minutes` run trains: `reprogate plan --write` measures this machine once and
writes it; every rerun and resume then trains exactly those steps.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from reprogate.specs.base import ModelName, PosInt, Strict


class Measured(Strict):
    """What `reprogate plan --write` measured, kept for the reader (never read back by training)."""

    update_s: float = Field(gt=0)
    checkpoint_s: float = Field(ge=0)
    updates_timed: PosInt
    tokens_per_s: float = Field(gt=0)
    device: str
    host: str
    cpu: str
    threads: PosInt
    torch: str
    at: str = Field(description="UTC time of the measurement, ISO 8601.")


class PlanSpec(Strict):
    kind: Literal["plan"]
    model: ModelName = Field(description="The model spec this plan is for.")
    train_minutes: float = Field(gt=0, description="The budget it was measured for.")
    speed_key: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="Hash of the spec fields that decide an update's time (model shape, batch, "
        "device, precision, threads, processes): another value means the plan is stale.",
    )
    steps: PosInt = Field(description="Optimizer updates the run trains: what fits in train_minutes.")
    measured: Measured


def speed_fields(spec: Any) -> dict[str, Any]:
    """The model spec fields an update's time depends on (the plan's speed_key hashes them)."""
    return {
        # Not the caps a stage checks before training (tokenizer.max_vocab): they change no update.
        "causal_lm": spec.causal_lm.model_dump(
            mode="json", exclude={"eval_points": True, "tokenizer": {"max_vocab"}}
        ),
        **{k: getattr(spec, k) for k in ("micro_batch", "grad_accum", "device", "precision", "threads")},
        "processes": spec.processes,
    }
