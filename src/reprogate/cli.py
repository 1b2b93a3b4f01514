"""Thin command line over the stages. A UserError prints one paragraph and exits 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reprogate.errors import UserError
from reprogate.specs import find_root


def _validate(args: argparse.Namespace) -> int:
    from reprogate.specs import iter_spec_files, load_spec

    files = iter_spec_files([Path(p) for p in args.paths])
    if not files:
        raise UserError(f"no .yaml specs found under {' '.join(args.paths)}.")
    failed = 0
    for f in files:
        try:
            spec = load_spec(f)
            print(f"ok    {f} ({spec.kind})")
        except UserError as e:
            failed += 1
            print(f"error {e}", file=sys.stderr)
    print(f"validate: {len(files) - failed} of {len(files)} spec(s) valid")
    return 1 if failed else 0


def _schema(args: argparse.Namespace) -> int:
    from reprogate.specs import json_schemas

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for kind, schema in json_schemas().items():
        (out / f"{kind}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    print(f"schema: wrote {len(json_schemas())} JSON Schema files to {out}/")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from reprogate.compile import compile_dvc

    print(compile_dvc(find_root(Path.cwd()), check=args.check))
    return 0


def _stage(args: argparse.Namespace) -> int:
    root = find_root(Path.cwd())
    if args.name == "prepare":
        from reprogate.compile import load_pipeline
        from reprogate.stages.prepare import prepare, summary

        spec = Path(args.spec) if args.spec else root / load_pipeline(root).data
        print(summary(prepare(spec, root)))
        return 0
    if args.name == "train":
        from reprogate.stages import train

        m = train.run(root, _model_paths(root, args), skip_plan=args.skip_plan)
        print(
            f"train: {args.model}: {m['steps']} steps on {m['device']} in {m['wall_s']:.1f} s, "
            f"{m['examples_per_s']} examples/s, final loss {m['final_loss']:.4f}, validation accuracy "
            f"{m['validation_accuracy']:.4f}, peak memory {m['peak_rss_gb']:.2f} GB"
        )
        return 0
    if args.name == "features":
        from reprogate.stages import features

        if not args.model:
            raise UserError("stage features needs a model name, e.g. `reprogate stage features ngram`.")
        print(features.run(root, args.model))
        return 0
    if args.name == "resume_check":
        from reprogate.stages import resume_check

        if not args.model:
            raise UserError(
                "stage resume_check needs a model name, e.g. `reprogate stage resume_check ngram`."
            )
        print(resume_check.summary(args.model, resume_check.run(root, args.model)))
        return 0
    raise UserError(f"unknown stage '{args.name}'")


def _model_paths(root: Path, args: argparse.Namespace):
    from reprogate.stages.train import Paths

    if not args.model:
        raise UserError(f"stage {args.name} needs a model name, e.g. `reprogate stage {args.name} ngram`.")
    return Paths.for_model(
        root,
        args.model,
        Path(args.spec) if args.spec else None,
        Path(args.run_dir) if args.run_dir else None,
        Path(args.work_dir) if args.work_dir else None,
    )


def _plan(args: argparse.Namespace) -> int:
    from reprogate.plan import measure
    from reprogate.stages.train import Paths, Setup

    root = find_root(Path.cwd())
    spec = Path(args.spec)
    setup = Setup(root, Paths.for_model(root, spec.stem, spec))
    print(measure(setup).line())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reprogate", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="validate spec files or folders; no training")
    v.add_argument("paths", nargs="+")
    v.set_defaults(func=_validate)

    s = sub.add_parser("schema", help="write JSON Schema for every spec kind")
    s.add_argument("--out", default="specs/schema")
    s.set_defaults(func=_schema)

    c = sub.add_parser("compile", help="specs -> dvc.yaml")
    c.add_argument("--check", action="store_true", help="fail if dvc.yaml is stale")
    c.set_defaults(func=_compile)

    st = sub.add_parser("stage", help="run one pipeline stage (what dvc repro calls)")
    st.add_argument("name", choices=["prepare", "features", "train", "resume_check"])
    st.add_argument("model", nargs="?", help="model spec name (specs/models/NAME.yaml)")
    st.add_argument("--spec", help="spec file (default: params.yaml 'data' / specs/models/NAME.yaml)")
    st.add_argument("--run-dir", help="checkpoint folder (default: runs/NAME)")
    st.add_argument("--work-dir", help="put checkpoints, model, metrics and plots of this run here")
    st.add_argument("--skip-plan", action="store_true", help="do not measure/project before training")
    st.set_defaults(func=_stage)

    pl = sub.add_parser("plan", help="measure a few real steps and project time and memory")
    pl.add_argument("spec")
    pl.set_defaults(func=_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"reprogate: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reprogate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
