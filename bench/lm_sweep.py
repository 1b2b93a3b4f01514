"""What is the best language model this machine trains in five minutes? A size sweep.

Every size gets the same budget (`budget.train_minutes`, 5 by default): `reprogate plan --write`
measures it here and fixes its updates, then the real stages train and score it. The choice is
made without the validation split: the sweep's corpus is the train part alone (the first 90%
of Tiny Shakespeare), whose last ninth (111,539 characters, the size of the real validation
split) is the "dev" part the sizes are compared on. Only the chosen spec is then scored on the
real validation split, by `make repro-lm`.

    python bench/lm_sweep.py [--minutes 5] [--sizes 0.2M,0.4M,...] [--out bench/results/lm_sweep.json]

Writes per size: parameters (with and without embeddings), planned updates, tokens seen, tokens
per parameter, tokens/s as planned and as trained, dev bits and nats per character.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Shapes from ~0.2M to ~4M parameters (12 d_model^2 per layer with the SwiGLU MLP, plus the
# 65-character embedding and the learned positions).
SIZES = {
    "0.2M": {"n_layer": 2, "d_model": 96, "n_head": 4},
    "0.4M": {"n_layer": 3, "d_model": 112, "n_head": 4},
    "0.8M": {"n_layer": 4, "d_model": 128, "n_head": 4},
    "1.8M": {"n_layer": 4, "d_model": 192, "n_head": 4},
    "4M": {"n_layer": 5, "d_model": 256, "n_head": 4},
}


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(BIN / "reprogate"), *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"reprogate {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return proc.stdout


def project(where: Path, train_text: Path) -> Path:
    """A language-model project whose corpus is the real train part only."""
    import hashlib

    root = where / "sweep"
    shutil.copytree(REPO / "lm" / "specs", root / "specs")
    for f in (root / "specs" / "models").iterdir():  # the sweep's own specs only
        f.unlink()
    (root / "raw").mkdir()
    shutil.copyfile(train_text, root / "raw" / "train.txt")
    sha = hashlib.sha256(train_text.read_bytes()).hexdigest()
    spec = yaml.safe_load((REPO / "lm" / "specs" / "data" / "tinyshakespeare.yaml").read_text())
    spec.update(
        id="tinyshakespeare-train",
        origins={"train": {"source": {"kind": "local", "path": "raw"}, "files": {"train.txt": sha}}},
        corpus=[{"origin": "train", "file": "train.txt"}],
        split={"kind": "tail", "validation": round(1 / 9, 6)},
    )
    (root / "specs" / "data" / "dev.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = yaml.safe_load((REPO / "lm" / "params.yaml").read_text())
    params.update(data="specs/data/dev.yaml", models=["s0_2m"], mirror=[])
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "models").mkdir()
    (root / "models" / "production.json").write_text('{"model": null}\n')
    _run(root, "stage", "corpus", "--spec", "specs/data/dev.yaml")
    return root


def one(root: Path, label: str, shape: dict, minutes: float, extra: dict | None = None) -> dict:
    """One spec: the default's, with this shape (causal_lm fields) and `extra` (top-level fields,
    e.g. optimizer or micro_batch), trained for `minutes` as planned here and scored on dev."""
    base = yaml.safe_load((REPO / "lm" / "specs" / "models" / "gpt.yaml").read_text())
    spec = dict(base, data="specs/data/dev.yaml", budget=dict(base["budget"], train_minutes=minutes))
    spec["causal_lm"] = dict(base["causal_lm"], **shape)
    spec.update(extra or {})
    name = "s" + label.replace(".", "_").lower()
    (root / "specs" / "models" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    _run(root, "stage", "tokenize", name)
    _run(root, "plan", name, "--write")
    plan = yaml.safe_load((root / "specs" / "models" / f"{name}.plan.yaml").read_text())
    t0 = time.perf_counter()
    _run(root, "stage", "train", name, "--skip-plan")
    train_s = time.perf_counter() - t0
    _run(root, "stage", "lm_evaluate", name)
    ev = json.loads((root / "results" / name / "eval.json").read_text())
    log = [json.loads(x) for x in (root / "logs" / f"train@{name}.jsonl").read_text().splitlines()]
    dev = ev["sets"]["validation"]
    row = {
        "size": label,
        **shape,
        "parameters": ev["parameters"],
        "parameters_without_embeddings": ev["parameters_without_embeddings"],
        "planned_updates": plan["steps"],
        "tokens_seen": ev["tokens_seen"],
        "tokens_per_parameter": ev["tokens_per_parameter"],
        "tokens_per_s_planned": plan["measured"]["tokens_per_s"],
        "tokens_per_s_trained": log[-1]["telemetry"].get("tokens_per_s"),
        "train_stage_s": round(train_s, 1),
        "dev_bits_per_char": round(dev["bits_per_char"], 4),
        "dev_nats_per_char": round(dev["nats_per_char"], 4),
        "train_bits_per_char": round(ev["sets"]["train"]["bits_per_char"], 4),
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "lm_sweep.json"))
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="instead of the sizes: LABEL=JSON of spec fields, e.g. "
        '\'ctx128={"causal_lm": {"context": 128}, "micro_batch": 16}\'',
    )
    args = ap.parse_args()
    train_text = REPO / "lm" / "data" / "corpus" / "train.txt"
    if not train_text.is_file():
        raise SystemExit(
            f"{train_text} is missing: run `make repro-lm` (or `cd lm && dvc repro corpus`) first"
        )
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="reprogate-lm-sweep-") as tmp:
        root = project(Path(tmp), train_text)
        if args.variant:
            rows = []
            for v in args.variant:
                label, _, raw = v.partition("=")
                extra = json.loads(raw)
                rows.append(one(root, label, extra.pop("causal_lm", {}), args.minutes, extra))
        else:
            rows = [one(root, s, SIZES[s], args.minutes) for s in args.sizes.split(",")]
    best = min(rows, key=lambda r: r["dev_bits_per_char"])
    out = {
        "commit": commit,
        "machine": f"{os.cpu_count()} CPU cores",
        "minutes": args.minutes,
        "measured_on": "dev: the last ninth of the train part (never the validation split)",
        "rows": rows,
        "best": best["size"],
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(
        f"lm_sweep: {len(rows)} sizes in {args.minutes:g} min each; best on dev: {best['size']} "
        f"({best['dev_bits_per_char']} bits/char); wrote {args.out}"
    )


if __name__ == "__main__":
    main()
