"""`reprogate validate` and `reprogate schema`: the specs alone, no training."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reprogate.specs.catalog import load_any
from reprogate.specs.loader import find_root
from reprogate.utils.errors import UserError, relative


def _validate(args: argparse.Namespace) -> int:
    from reprogate.specs.catalog import iter_spec_files
    from reprogate.specs.loader import missing_extra
    from reprogate.specs.model import ModelSpec

    files = iter_spec_files([Path(p) for p in args.paths])
    if not files:
        raise UserError(f"no .yaml specs found under {' '.join(args.paths)}.")
    root = find_root(Path.cwd())
    failed = 0
    for f in files:
        try:
            spec = load_any(f)
            steps = _epoch_steps(root, spec, f) if isinstance(spec, ModelSpec) else None
            notes = [f"{steps} steps on the prepared data"] if steps else []
            notes += [f"runs after `{x}`" for x in [missing_extra(spec, root)] if x]
            print(f"ok    {f} ({'; '.join([spec.kind, *notes])})")
        except UserError as e:
            failed += 1
            print(f"error {relative(str(e), root)}", file=sys.stderr)
    print(f"validate: {len(files) - failed} of {len(files)} spec(s) valid")
    return 1 if failed else 0


def _epoch_steps(root: Path, spec, path: Path) -> int | None:
    """An epoch-based run's length depends on the data: checked when it is prepared. Counting
    loads the trainer's module (torch, 2 s), so only a spec that counts in epochs pays for it."""
    if not spec.trained or spec.steps is not None:
        return None
    from reprogate.train.run import prepared_steps

    return prepared_steps(root, spec, path)


def _schema(args: argparse.Namespace) -> int:
    from reprogate.specs.catalog import json_schemas

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: that is a file; give a folder for the JSON Schema files.")
    out.mkdir(parents=True, exist_ok=True)
    for kind, schema in json_schemas().items():
        (out / f"{kind}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    print(f"schema: wrote {len(json_schemas())} JSON Schema files to {out}/")
    return 0


def add_parsers(sub) -> None:
    v = sub.add_parser("validate", help="validate spec files or folders; no training")
    v.add_argument("paths", nargs="+")
    v.set_defaults(func=_validate)

    s = sub.add_parser("schema", help="write JSON Schema for every spec kind")
    s.add_argument("--out", default="specs/schema")
    s.set_defaults(func=_schema)
