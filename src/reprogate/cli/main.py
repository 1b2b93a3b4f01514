"""Thin command line over the stages. A UserError prints one paragraph and exits 2."""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from collections import Counter
from pathlib import Path

from reprogate.cli import args as cli_args
from reprogate.cli import doctor as cli_doctor
from reprogate.cli import encoders as cli_encoders
from reprogate.cli import lm as cli_lm
from reprogate.cli import specs as cli_specs
from reprogate.pipeline.runner import NAMES
from reprogate.pipeline.verify import DEFAULT_TOLERANCE
from reprogate.registry import command as registry
from reprogate.runtime.device import DEVICES
from reprogate.specs.loader import find_root
from reprogate.specs.pipeline import PARTS
from reprogate.utils import jsonl, queries
from reprogate.utils.errors import UserError, relative

# Serving is a deployment choice, separate from the device a model was trained on.
DEVICE_HELP = "where to run the model (default auto: CUDA, else MPS, else CPU), whatever it was trained on"


def _compile(args: argparse.Namespace) -> int:
    from reprogate.pipeline.compile import compile_dvc

    print(compile_dvc(find_root(Path.cwd()), check=args.check))
    return 0


def _stage(args: argparse.Namespace) -> int:
    from reprogate.pipeline import runner
    from reprogate.pipeline.context import Context

    opt = lambda v: Path(v) if v else None  # noqa: E731
    ctx = Context(
        find_root(Path.cwd()),
        args.model,
        opt(args.spec),
        opt(args.run_dir),
        opt(args.work_dir),
        args.skip_plan,
        args.pipeline,
    )
    said = runner.run(args.name, ctx).summary
    if said:  # empty from training ranks other than 0, and from their launcher
        print(said)
    return 0


def _promote(args: argparse.Namespace) -> int:
    from reprogate.promote.promotion import promote

    print(promote(_project(), dry_run=args.dry_run, push=args.push, part=args.pipeline))
    return 0


def _report(args: argparse.Namespace) -> int:
    from reprogate.report.build import write

    rebuilt = Path(args.base_rebuilt) if args.base_rebuilt else None
    print(write(_project(), args.base, args.head, Path(args.out), base_rebuilt=rebuilt, part=args.pipeline))
    return 0


def _remote(args: argparse.Namespace) -> int:
    from reprogate.pipeline.remote import configure

    print(configure(_project(), args.url, local=args.local))
    return 0


def _registry(args: argparse.Namespace) -> int:
    from reprogate.registry.command import command

    print(command(_project(), args), end="")
    return 0


def _history(args: argparse.Namespace) -> int:
    from reprogate.promote.history import history

    print(history(_project()))
    return 0


def _project() -> Path:
    """The project this command works on; outside one, say so rather than report a missing file."""
    root = find_root(Path.cwd())
    if not (root / "params.yaml").is_file():
        raise UserError(
            f"{Path.cwd()}: not inside a reprogate project (no params.yaml here or in a parent "
            "folder); run this from the project's folder, the one with params.yaml and dvc.yaml."
        )
    return root


def _predict(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from reprogate.predict.production import load_servable

    path = Path(args.input) if args.input else None
    # A file is checked whole before anything is predicted, then read again as it is answered:
    # bounded memory, and a refusal leaves no partial output anywhere.
    count = (
        queries.open_input(path, args.max_chars)
        if path
        else len(queries.from_args(args.texts, args.max_chars))
    )
    target = Path(args.output) if args.output else None
    if target is not None and (target.is_dir() or not target.parent.is_dir()):
        raise UserError(
            f"--output {target}: "
            + ("is a folder" if target.is_dir() else f"folder {target.parent} does not exist")
            + "; give a file path in an existing folder, e.g. predictions.jsonl."
        )
    loaded = load_servable(_project(), Path(args.model) if args.model else None, args.device)
    if loaded.verified is False:
        print(f"predict: note: {loaded.unverified}", file=sys.stderr)
    started = time.perf_counter()
    texts = queries.from_file(path, args.max_chars) if path else iter(args.texts)
    # A file of queries is long work: a progress bar and a closing summary, both on stderr.
    queue = tqdm(texts, total=count, desc="predict", unit="query", mininterval=2.0) if path else texts
    routes: Counter[str] = Counter()

    def predictions():
        for t in queue:  # one query at a time, so each latency_ms is that query's own
            p = loaded.predict([t])[0]
            routes[p["route"]] += 1
            routes["out of scope"] += "out_of_scope" in p["reasons"]
            yield jsonl.line(p)

    _write(target, predictions())
    if path:
        print(
            f"predict: {count} queries from {args.input} -> {target or 'stdout'} with {loaded.version}: "
            f"{routes['act']} act, {routes['review']} review ({routes['out of scope']} out of scope) "
            f"in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
    return 0


def _write(target: Path | None, lines) -> None:
    if target is None:
        sys.stdout.writelines(lines)
    elif target.exists() and not target.is_file():
        # /dev/null, a pipe: written to as it is (renaming over it would replace the device).
        try:
            with open(target, "w", encoding="utf-8") as f:
                f.writelines(lines)
        except OSError as e:
            e.filename = e.filename or str(target)
            raise
    else:
        # Written beside the target and renamed when complete: an existing file is never half-overwritten.
        part = target.with_name(f".{target.name}.part")
        try:
            with open(part, "w", encoding="utf-8") as f:
                f.writelines(lines)
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)


def _serve(args: argparse.Namespace) -> int:
    from reprogate.serve.admission import Bounds
    from reprogate.serve.app import serve
    from reprogate.serve.limits import Limits

    model = Path(args.model) if args.model else None
    limits = Limits(
        args.watch_interval,
        args.header_timeout,
        args.max_connections,
        args.batch_wait_ms,
        body_timeout=args.body_timeout,
        admit=Bounds(args.max_clauses, args.max_request_rows),
        max_queued_rows=args.max_queued_rows,
    )
    serve(_project(), args.host, args.port, model, args.device, limits)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from reprogate.pipeline.verify import verify

    rebuilt = Path(args.rebuilt) if args.rebuilt else None
    status, said = verify(_project(), args.rev, rebuilt, args.tolerance, args.pipeline)
    print(said)
    return status


def _add_report(sub) -> None:
    rp = sub.add_parser("report", help="compare two revisions from their files: report.md + PNG plots")
    rp.add_argument("--base", required=True, help="the revision to compare with (e.g. origin/main)")
    rp.add_argument("--head", help="the revision under review (default: the working tree)")
    rp.add_argument("--out", default="report", help="folder for report.md, report.json and plots")
    rp.add_argument(
        "--base-rebuilt",
        metavar="DIR",
        help="a rebuild of the base (its project folder after `make repro`): the report says whether it "
        "reproduced the base commit, per output, as `reprogate verify` does",
    )
    rp.add_argument("--pipeline", choices=PARTS, default="default", help="whose gate (experiments/ has one)")
    rp.set_defaults(func=_report)


def _add_serve(sub) -> None:
    sv = sub.add_parser("serve", help="HTTP JSON API over the production model, with hot reload")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=cli_args.port, default=8080)
    sv.add_argument("--model", help="serve this model folder instead of production (not watched)")
    sv.add_argument("--device", choices=DEVICES, default="auto", help=DEVICE_HELP)
    sv.add_argument(
        "--watch-interval",
        type=cli_args.positive_seconds,
        default=1.0,
        help="seconds between looks at models/production.json for a promotion or rollback (default 1)",
    )
    sv.add_argument(
        "--header-timeout",
        type=cli_args.positive_seconds,
        default=10.0,
        help="close a connection whose request headers are not complete this many seconds after it "
        "connected or got its last answer (default 10)",
    )
    sv.add_argument(
        "--body-timeout",
        type=cli_args.positive_seconds,
        default=30.0,
        help="close a connection whose request body is not complete this many seconds after its "
        "headers (default 30)",
    )
    sv.add_argument(
        "--max-connections",
        type=cli_args.positive_int,
        help="open connections at most; at the cap the oldest one still owing its headers or body is closed "
        "(default: the open-file limit less 256, at most 4096)",
    )
    sv.add_argument(
        "--batch-wait-ms",
        type=cli_args.wait_ms,
        default=2.0,
        help="how long a query waits for concurrent ones to share one model call (default 2; 0: none)",
    )
    for flag, default, what in (
        ("--max-clauses", 16, "clauses one query may have, each scored on its own (422 past it)"),
        ("--max-request-rows", 512, "model rows one request may cost: a query, plus its clauses (422)"),
        ("--max-queued-rows", 4096, "model rows waiting in all; past it a request is refused at once (503)"),
    ):  # fmt: skip
        sv.add_argument(flag, type=cli_args.positive_int, default=default, help=f"{what} (default {default})")
    sv.set_defaults(func=_serve)


def _add_verify(sub) -> None:
    ve = sub.add_parser(
        "verify",
        help="rebuild a commit from nothing here and say, per output, if it reproduced",
        epilog="exit status: 0 every output bitwise and every decision held; 1 some outputs only "
        "within tolerance; 3 an output different or missing; 4 a decision changed; 5 the outputs "
        "reproduced but a decision could not be checked (the line says why and how to get it)",
    )
    ve.add_argument("rev", nargs="?", default="HEAD", help="the commit (default HEAD)")
    ve.add_argument("--rebuilt", help="compare this folder, already rebuilt (a fresh clone after make repro)")
    ve.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="largest difference of a JSON number called equal",
    )
    ve.add_argument("--pipeline", choices=PARTS, default="default", help="whose dvc.lock and gate")
    ve.set_defaults(func=_verify)


def _status(args: argparse.Namespace) -> int:
    from reprogate.pipeline.status import status

    lines, clean = status(find_root(Path.cwd()))
    print("\n".join(lines))
    return 0 if clean else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reprogate", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    cli_specs.add_parsers(sub)

    c = sub.add_parser("compile", help="specs -> dvc.yaml")
    c.add_argument("--check", action="store_true", help="fail if dvc.yaml is stale")
    c.set_defaults(func=_compile)

    st = sub.add_parser("stage", help="run one pipeline stage (what dvc repro calls)")
    st.add_argument(
        "name",
        choices=NAMES,
    )
    st.add_argument("model", nargs="?", help="model spec name (specs/models/NAME.yaml)")
    st.add_argument("--spec", help="spec file (default: params.yaml 'data' / specs/models/NAME.yaml)")
    st.add_argument("--run-dir", help="checkpoint folder (default: runs/NAME)")
    st.add_argument("--work-dir", help="put checkpoints, model, metrics and plots of this run here")
    st.add_argument("--skip-plan", action="store_true", help="do not measure/project before training")
    st.add_argument("--pipeline", choices=PARTS, default="default", help="gate: which")
    st.set_defaults(func=_stage)

    pr = sub.add_parser(
        "promote", help="put the model that passed the gate into production (git commit + tag)"
    )
    pr.add_argument("--dry-run", action="store_true", help="show what would be written and committed")
    push = "push the outputs to the DVC remote first (a failure changes nothing), then the commit and tag"
    pr.add_argument("--push", action="store_true", help=push)
    pr.add_argument("--pipeline", choices=PARTS, default="default", help="whose gate (experiments/ has one)")
    pr.set_defaults(func=_promote)

    _add_report(sub)

    rm = sub.add_parser("remote", help="make URL the project's default DVC remote (make remote URL=...)")
    rm.add_argument("url", nargs="?", help="a local folder (default ../reprogate-remote), s3://, gs://, ...")
    rm.add_argument("--local", action="store_true", help="in .dvc/config.local: this copy only")
    rm.set_defaults(func=_remote)

    registry.add_parser(sub).set_defaults(func=_registry)

    ss = sub.add_parser("status", help="is each pipeline built and up to date? (one line each)")
    ss.set_defaults(func=_status)

    hi = sub.add_parser("history", help="the promotions, from git")
    hi.set_defaults(func=_history)

    pd = sub.add_parser("predict", help="routed predictions from the production model")
    pd.add_argument("texts", nargs="*")
    pd.add_argument("--input", help=".txt (one query per line) or .jsonl with a 'text' field")
    pd.add_argument("--output", help="write JSON lines here instead of stdout")
    pd.add_argument(
        "--max-chars",
        type=cli_args.positive_int,
        default=queries.MAX_QUERY_CHARS,
        help=f"refuse a query longer than this (default {queries.MAX_QUERY_CHARS}, the server's bound)",
    )
    pd.add_argument("--model", help="a model folder (default: the one in models/production.json)")
    pd.add_argument("--device", choices=DEVICES, default="auto", help=DEVICE_HELP)
    pd.set_defaults(func=_predict)

    _add_serve(sub)

    _add_verify(sub)
    cli_doctor.add_parser(sub)
    cli_encoders.add_parser(sub)

    cli_lm.add_parsers(sub, cli_args.positive_int, DEVICE_HELP)
    return p


# Errors of the machine a run can hit anywhere it writes (disk full, quota, read-only).
MACHINE_LIMITS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"reprogate: {relative(str(e), find_root(Path.cwd()))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reprogate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except OSError as e:
        if e.errno not in MACHINE_LIMITS:
            raise
        # The machine, not the code: say which file and what to do, not a traceback.
        print(
            f"reprogate: could not write {e.filename or 'a file'}: {e.strerror}. Free space (or "
            "raise the quota, or make the folder writable) and run the same command again. "
            "Nothing complete was lost: prepared data, features and checkpoints are only ever "
            "replaced whole, and training resumes from its last committed checkpoint.",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
