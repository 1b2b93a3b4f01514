"""The commands of `reprogate` that measure and generate: `plan` (every trained family; --write
for a language model's time budget) and `generate` (the production language model)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reprogate.runtime.device import DEVICES
from reprogate.specs.loader import find_root
from reprogate.specs.pipeline import PARTS
from reprogate.utils import dvc_cli
from reprogate.utils.errors import UserError


def _plan(args: argparse.Namespace) -> int:
    from reprogate.specs.loader import load_spec
    from reprogate.specs.model import ModelSpec
    from reprogate.train.plan import measure
    from reprogate.train.runs import Paths

    root = find_root(Path.cwd())
    if args.spec is None:
        return _plan_pipeline(root, args)
    spec = Path(args.spec)
    if not spec.exists() and (root / "specs" / "models" / f"{args.spec}.yaml").is_file():
        spec = root / "specs" / "models" / f"{args.spec}.yaml"  # a model name, as the stages take
    spec_obj = load_spec(spec, ModelSpec)
    declared = spec_obj.family_def
    if not declared.trained:
        raise UserError(
            f"{spec}: family {spec_obj.family} is not trained ({declared.built_by}@{spec.stem} builds it "
            f"in seconds); plan what it is built from instead: {', '.join(declared.sources(spec_obj))}."
        )
    if declared.planned and args.write:
        from reprogate.lm.plan import write_plan

        print(write_plan(root, spec.resolve()))
        return 0
    if args.write:
        raise UserError(
            f"{spec}: --write fixes the updates of a language model's budget.train_minutes; a "
            f"{spec_obj.family} run's length is its steps or epochs. Plan without --write."
        )
    setup_class = declared.part("setup")
    planning = {"planning": True} if declared.planned else {}
    setup = setup_class(root, Paths.for_model(root, spec.stem, spec), **planning)
    line = measure(setup).line()
    if setup.spec.processes > 1:  # what `stage train` measures in all its ranks before it starts
        line += (
            f"; measured in this one process, for {setup.spec.processes} processes each taking "
            f"1/{setup.spec.processes} of every epoch (gradient exchange not included)"
        )
    print(line)
    return 0


def _plan_pipeline(root: Path, args: argparse.Namespace) -> int:
    """`reprogate plan` without a spec: the whole pipeline's projected time (or, with
    --write-table SECONDS, the stage table from the run that just took that long)."""
    from reprogate.pipeline import projection

    dvc_yaml = dvc_cli.pipeline_file(args.pipeline)
    if not (root / dvc_yaml).is_file():
        raise UserError(f"{root / dvc_yaml}: no such pipeline here; `reprogate compile` writes it.")
    if args.write_table is not None:
        print(projection.write_table(root, dvc_yaml, args.write_table))
    else:
        print(projection.describe(root, dvc_yaml, everything=args.all))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from reprogate.predict.lm import load_generator

    root = find_root(Path.cwd())
    if not (root / "params.yaml").is_file() and not args.model:
        raise UserError(
            f"{Path.cwd()}: not inside a reprogate project (no params.yaml here or above); run it in "
            "the language-model project (lm/), or give --model models/NAME."
        )
    loaded = load_generator(root, Path(args.model) if args.model else None, args.device)
    if loaded.verified is False:
        print(f"generate: note: {loaded.unverified}", file=sys.stderr)
    out = loaded.generate(args.prompt, args.max_tokens, args.seed, args.temperature, args.top_k)
    print(out["prompt"] + out["text"])
    print(
        f"generate: {out['tokens']} tokens from {out['model_version']} (seed {out['seed']}, temperature "
        f"{out['temperature']:g}) in {out['latency_ms'] / 1000:.2f} s",
        file=sys.stderr,
    )
    return 0


def _number(kind):
    def parse(value: str):
        try:
            return kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a {kind.__name__}") from None

    return parse


def add_parsers(sub, positive, device_help: str) -> None:
    pl = sub.add_parser(
        "plan", help="a model: measure a few real steps, project time and memory; no model: the pipeline"
    )
    pl.add_argument(
        "spec",
        nargs="?",
        help="a model spec file, or the name of one under specs/models/; without one, the whole "
        "pipeline's projected time, stage by stage",
    )
    pl.add_argument("--pipeline", choices=PARTS, default="default")
    pl.add_argument("--all", action="store_true", help="every stage, as `dvc repro -f` runs them")
    pl.add_argument(
        "--write-table",
        type=float,
        metavar="SECONDS",
        help="after a full run that took SECONDS: record stage-times.json beside the dvc.yaml",
    )
    pl.add_argument(
        "--write",
        action="store_true",
        help="language models: measure, and fix budget.train_minutes as a number of updates in "
        "specs/models/<m>.plan.yaml (commit it)",
    )
    pl.set_defaults(func=_plan)

    ge = sub.add_parser("generate", help="continue a prompt with the production language model (in lm/)")
    ge.add_argument("prompt")
    ge.add_argument("--max-tokens", type=positive, default=200, help="new tokens, at most 2000")
    ge.add_argument("--seed", type=_number(int), default=0)
    ge.add_argument("--temperature", type=_number(float), default=0.8)
    ge.add_argument("--top-k", type=positive, default=None)
    ge.add_argument("--model", help="this language-model folder instead of production")
    ge.add_argument("--device", choices=DEVICES, default="auto", help=device_help)
    ge.set_defaults(func=_generate)
