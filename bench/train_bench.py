"""Training benchmarks on BANKING77 (numbers for README; not a test).

    make bench            # or: python bench/train_bench.py [--skip-encoder]

Reports, measured on this machine:
  - ngram (specs/models/ngram.yaml): full training wall time and examples/s, and the share of
    training time spent writing checkpoints at the spec's default interval (target < 5%);
  - encoder fine-tune (specs/models/minilm.yaml): examples/s over real updates;
  - frozen-encoder feature extraction: texts/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from reprogate.data.prepare import prepare
from reprogate.data.prepared import texts
from reprogate.train import job
from reprogate.train import run as training
from reprogate.train.plan import measure

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-encoder", action="store_true")
    args = ap.parse_args()
    if not (ROOT / "data" / "prepared" / "train.jsonl").is_file():
        prepare(ROOT / "specs" / "data" / "banking77.yaml", ROOT)
    rows = []
    with tempfile.TemporaryDirectory(
        prefix="bench-", dir=ROOT / "runs" if (ROOT / "runs").is_dir() else None
    ) as tmp:
        paths = training.Paths.for_model(ROOT, "ngram", work=Path(tmp) / "ngram")
        m = job.train(ROOT, paths, training.Setup, skip_plan=False, log=lambda s: None)
    rows.append(
        (
            "ngram full train, wall time (s)",
            m["wall_s"],
            f"projected {m['projected']['projected_minutes'] * 60:.1f} s",
        )
    )
    rows.append(("ngram train examples/s", m["examples_per_s"], f"{m['steps']} updates"))
    rows.append(("ngram checkpoint share of training time", m["checkpoint_share"], "target < 0.05"))
    rows.append(("ngram validation accuracy", m["validation_accuracy"], "not a test-set number"))
    if not args.skip_encoder:
        setup = training.Setup(ROOT, training.Paths.for_model(ROOT, "minilm"))
        plan = measure(setup, warmup=2, timed=10, max_seconds=120)
        per_update = setup.spec.micro_batch * setup.spec.grad_accum
        rows.append(
            (
                "minilm fine-tune examples/s",
                round(per_update / plan.update_s, 1),
                f"{plan.update_s:.2f} s/update, projected {plan.projected_minutes:.1f} min "
                f"for {plan.total_steps} updates",
            )
        )
        from reprogate import models
        from reprogate.specs.loader import load_spec
        from reprogate.specs.model import ModelSpec

        frozen = load_spec(ROOT / "specs" / "models" / "minilm.yaml", ModelSpec).model_copy(deep=True)
        object.__setattr__(frozen.encoder, "mode", "frozen")
        _, feat = models.build(frozen, 2, ROOT)
        sample = texts(ROOT, "validation")
        t = time.perf_counter()
        feat.encode(sample)
        rows.append(
            (
                "frozen MiniLM embedding texts/s",
                round(len(sample) / (time.perf_counter() - t), 1),
                f"{len(sample)} validation texts",
            )
        )
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value!s:>10}  {note}")
    print(json.dumps({r[0]: r[1] for r in rows}))


if __name__ == "__main__":
    main()
